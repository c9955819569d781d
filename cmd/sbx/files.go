package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/sbx-sandbox/sbx/client"
)

const filesUsage = `usage: sbx files COMMAND [flags] SESSION [ARGS]

commands:
  upload SESSION FILE...  upload files into the session's workspace
      --path P              destination: a directory ending in "/", or the
                            file's path for a single file (default: the
                            top, under each file's own name)
      --conversation CID    into that conversation's temp area instead
  ls SESSION [PATH]       list a directory of the workspace (default the top)
      -r                    the whole tree under it
      --conversation CID    that conversation's uploads instead
  get SESSION PATH        download a file
      -o OUT                write it to OUT (default standard output)
  rm SESSION PATH         delete a file
      -r                    a directory and everything under it

PATH is relative to the workspace (/workspace in the sandbox).

Exit status: 0 on success, 1 if the server refused (no such file, a file
too large, say), 2 for a usage error, 3 if the server failed or could not
be reached, or a local file could not be read or written.
` + clientFlagsUsage

// runFiles implements `sbx files`.
func runFiles(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, filesUsage)
		return 2
	}
	switch args[0] {
	case "upload", "put":
		return filesUpload(ctx, args[1:], stdout, stderr)
	case "ls", "list":
		return filesList(ctx, args[1:], stdout, stderr)
	case "get", "download":
		return filesGet(ctx, args[1:], stdout, stderr)
	case "rm", "delete":
		return filesRemove(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, filesUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "sbx files: unknown command %q\n\n%s", args[0], filesUsage)
		return 2
	}
}

func filesUpload(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("files upload", filesUsage, stderr)
	var opts client.UploadOptions
	fs.StringVar(&opts.Path, "path", "", "destination `path`")
	fs.StringVar(&opts.ConversationID, "conversation", "", "conversation `id`")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) < 2 {
		fmt.Fprintln(stderr, "sbx files upload: give a SESSION and at least one FILE")
		return 2
	}
	var files []client.UploadFile
	for _, name := range pos[1:] {
		f, err := os.Open(name)
		if err == nil {
			var fi os.FileInfo
			if fi, err = f.Stat(); err == nil && fi.IsDir() {
				err = fmt.Errorf("%s is a directory", name)
			}
		}
		if err != nil {
			fmt.Fprintln(stderr, "sbx files upload:", err)
			return 3
		}
		defer f.Close()
		files = append(files, client.UploadFile{Name: filepath.Base(name), Reader: f})
	}
	res, err := connect().Upload(ctx, pos[0], opts, files...)
	if err != nil {
		return failed(stderr, "files upload", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tSIZE\tSHA256\tIN THE SANDBOX")
	for _, f := range res.Files {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", f.Path, f.Size, f.SHA256, f.SandboxPath)
	}
	tw.Flush()
	return 0
}

func filesList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("files ls", filesUsage, stderr)
	var opts client.ListFilesOptions
	fs.BoolVar(&opts.Recursive, "r", false, "list the whole tree")
	fs.StringVar(&opts.ConversationID, "conversation", "", "conversation `id`")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) < 1 || len(pos) > 2 {
		fmt.Fprintln(stderr, "sbx files ls: give a SESSION and at most one PATH")
		return 2
	}
	if len(pos) == 2 {
		opts.Path = pos[1]
	}
	list, err := connect().ListFiles(ctx, pos[0], opts)
	if err != nil {
		return failed(stderr, "files ls", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tSIZE\tMODIFIED\tPATH")
	for _, f := range list.Files {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", f.Type, f.Size, localTime(f.ModifiedAt), f.Path)
	}
	tw.Flush()
	if list.Truncated {
		fmt.Fprintln(stderr, "sbx files ls: the listing is truncated; list a directory further down")
	}
	return 0
}

func filesGet(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	fs, connect := clientFlags("files get", filesUsage, stderr)
	out := fs.String("o", "", "write to `file` (default standard output)")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 2 {
		fmt.Fprintln(stderr, "sbx files get: give a SESSION and a PATH")
		return 2
	}
	w := stdout
	if *out != "" && *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			fmt.Fprintln(stderr, "sbx files get:", err)
			return 3
		}
		defer func() {
			if err := f.Close(); err != nil && code == 0 {
				fmt.Fprintln(stderr, "sbx files get:", err)
				code = 3
			}
			if code != 0 {
				os.Remove(*out) // no half-written file
			}
		}()
		w = f
	}
	if _, err := connect().Download(ctx, pos[0], pos[1], w); err != nil {
		return failed(stderr, "files get", err)
	}
	return 0
}

func filesRemove(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("files rm", filesUsage, stderr)
	recursive := fs.Bool("r", false, "delete a directory and everything under it")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 2 {
		fmt.Fprintln(stderr, "sbx files rm: give a SESSION and a PATH")
		return 2
	}
	if err := connect().DeleteFile(ctx, pos[0], pos[1], *recursive); err != nil {
		return failed(stderr, "files rm", err)
	}
	return 0
}
