package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxResourceDir bounds what `session resources` reads into memory.
const maxResourceDir = 512 << 20

// sessionResources implements `sbx session resources ID [DIR]`: with DIR,
// make the session's resources exactly DIR's regular files; without,
// list them.
func sessionResources(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("session resources", sessionUsage, stderr)
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 && len(pos) != 2 {
		fmt.Fprintln(stderr, "sbx session resources: give a session ID, and a directory to sync")
		return 2
	}
	c := connect()
	if len(pos) == 1 {
		list, err := c.ListResources(ctx, pos[0])
		if err != nil {
			return failed(stderr, "session resources", err)
		}
		printJSON(stdout, list)
		return 0
	}
	files, err := readResourceDir(pos[1])
	if err != nil {
		fmt.Fprintf(stderr, "sbx session resources: %v\n", err)
		return 2
	}
	res, err := c.SyncResources(ctx, pos[0], files)
	if err != nil {
		return failed(stderr, "session resources", err)
	}
	printJSON(stdout, res)
	return 0
}

// readResourceDir reads dir's regular files, by slash-separated path
// below dir. Links and special files are skipped: a resource is content.
func readResourceDir(dir string) (map[string][]byte, error) {
	files := map[string][]byte{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if total += int64(len(b)); total > maxResourceDir {
			return fmt.Errorf("%s: more than %d MiB of files", dir, maxResourceDir>>20)
		}
		files[filepath.ToSlash(rel)] = b
		return nil
	})
	return files, err
}
