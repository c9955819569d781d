package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"syscall"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

const (
	// DefaultMaxEntries is List's bound when the caller gives none.
	DefaultMaxEntries = 10_000
	// maxUsageEntries bounds Usage's walk. Past it the workspace is too
	// big to account for, which a quota treats as over.
	maxUsageEntries = 1 << 20
	// readBatch is how many directory entries are read at a time, so a
	// directory of a million files is never held whole.
	readBatch = 64
)

// Entry is one file, directory, link or special file in a listing.
type Entry struct {
	Name string `json:"name"`
	// Path is the workspace path, cleaned.
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other" (FIFO, socket, device).
	Type string `json:"type"`
	// Size is the length of a file or link target name, in bytes.
	Size int64 `json:"size"`
	// Mode holds the permission bits.
	Mode    fs.FileMode `json:"mode"`
	ModTime time.Time   `json:"mod_time"`
	// Target is a link's target as the link holds it; Stat fills it in,
	// List does not.
	Target string `json:"target,omitempty"`
	// Owner is "root" for what the sandbox's root owns (uploads/,
	// .resources/), "user" for the sandbox user's, "" for anything else.
	Owner string `json:"owner,omitempty"`
}

// Owners as Entry names them.
const (
	OwnerRoot = "root"
	OwnerUser = "user"
)

func (w *Local) newEntry(p string, fi fs.FileInfo) Entry {
	t := "other"
	switch m := fi.Mode(); {
	case m.IsRegular():
		t = "file"
	case m.IsDir():
		t = "dir"
	case m&fs.ModeSymlink != 0:
		t = "symlink"
	}
	e := Entry{Name: path.Base(p), Path: p, Type: t, Size: fi.Size(), Mode: fi.Mode().Perm(), ModTime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		switch int(st.Uid) {
		case w.owners.User.UID:
			e.Owner = OwnerUser
		case w.owners.Root.UID:
			e.Owner = OwnerRoot
		}
	}
	return e
}

// List lists the directory at rel, or describes the single file there. A
// link at rel itself is followed if it stays inside the workspace; links
// below it are listed as links, not followed. With recursive, the whole
// tree below rel is listed, shallowest entries first; either way at most
// maxEntries are returned (DefaultMaxEntries if <= 0), and truncated says
// when more were left out (as are directories nested deeper than
// MaxPathLen). Entries are sorted by path.
func (w *Local) List(ctx context.Context, rel string, recursive bool, maxEntries int) (entries []Entry, truncated bool, err error) {
	rel, err = CleanPath(rel)
	if err != nil {
		return nil, false, err
	}
	if maxEntries <= 0 {
		maxEntries = DefaultMaxEntries
	}
	fi, err := w.root.Stat(rel)
	if err != nil {
		return nil, false, classify(rel, err)
	}
	if !fi.IsDir() {
		return []Entry{w.newEntry(rel, fi)}, false, nil
	}
	entries = []Entry{}
	// Breadth first: when the listing is cut short, what is left out is
	// the deepest. The queue holds no more paths than entries listed.
	queue := []string{rel}
	for len(queue) > 0 {
		dir := queue[0]
		queue = queue[1:]
		more, err := w.readDir(dir, func(fi fs.FileInfo) bool {
			if len(entries) == maxEntries {
				truncated = true
				return false
			}
			e := w.newEntry(join(dir, fi.Name()), fi)
			entries = append(entries, e)
			if recursive && fi.IsDir() {
				if len(e.Path) >= MaxPathLen {
					truncated = true
				} else {
					queue = append(queue, e.Path)
				}
			}
			return true
		})
		if err != nil {
			if dir == rel {
				return nil, false, classify(rel, err)
			}
			if !gone(err) {
				return nil, false, fmt.Errorf("path %s: %w", quote(dir), err)
			}
		}
		if !more {
			break
		}
	}
	slices.SortFunc(entries, func(a, b Entry) int { return comparePaths(a.Path, b.Path) })
	return entries, truncated, nil
}

// readDir calls fn for the entries of the directory at dir, a batch at a
// time, until fn returns false (then more is false too). Entries are not
// followed (Readdir on a file opened in a Root lstats with fstatat).
func (w *Local) readDir(dir string, fn func(fs.FileInfo) bool) (more bool, err error) {
	// O_DIRECTORY: the directory may have become a FIFO since it was seen,
	// and opening that without it would wait for a writer.
	f, err := w.root.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return true, err
	}
	defer f.Close()
	for {
		infos, err := f.Readdir(readBatch)
		for _, fi := range infos {
			if !fn(fi) {
				return false, nil
			}
		}
		if err == io.EOF {
			return true, nil
		}
		if err != nil {
			return true, err
		}
	}
}

// readDirSorted is readDir in name order. It holds the directory's names
// (not their FileInfos) and refuses one of more than maxUsageEntries.
func (w *Local) readDirSorted(dir string, fn func(fs.FileInfo) bool) (more bool, err error) {
	f, err := w.root.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return true, err
	}
	defer f.Close()
	var names []string
	for {
		batch, err := f.Readdirnames(4096)
		names = append(names, batch...)
		if len(names) > maxUsageEntries {
			return false, fmt.Errorf("a directory has more than %d entries: %w", maxUsageEntries, errdefs.ErrResourceExhausted)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return true, err
		}
	}
	slices.Sort(names)
	for _, name := range names {
		fi, err := w.root.Lstat(join(dir, name))
		if err != nil {
			if gone(err) {
				continue // removed since it was listed
			}
			return true, err
		}
		if !fn(fi) {
			return false, nil
		}
	}
	return true, nil
}

// gone reports whether err says a directory seen during a walk is not
// there any more, or has been replaced by something not to walk into: the
// sandbox changes the tree as it likes, and that is not an error.
func gone(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) ||
		errors.Is(err, syscall.ELOOP) || isEscape(err)
}

func join(dir, name string) string {
	if dir == "." {
		return name
	}
	return dir + "/" + name
}

// comparePaths orders paths component by component ("a", "a/b", "a-b"),
// so that a directory's contents follow it.
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		return int(ca) - int(cb)
	}
	return len(a) - len(b)
}

// Usage returns the total size of the regular files in the workspace and
// the number of entries that are not directories (files, links, FIFOs:
// each costs an inode). Sizes are apparent ones, what a snapshot or a
// download of the tree costs, not allocated blocks. Links are not
// followed. The walk stops with errdefs.ErrResourceExhausted past 2^20
// entries or a path longer than MaxPathLen; a workspace that big is over
// any quota sbx sets.
func (w *Local) Usage(ctx context.Context) (bytes int64, files int, err error) {
	err = w.walk(ctx, func(_ string, fi fs.FileInfo) error {
		if !fi.IsDir() {
			files++
			if fi.Mode().IsRegular() {
				bytes += fi.Size()
			}
		}
		return nil
	})
	return bytes, files, err
}

// walk calls fn for every entry of the workspace but the top, depth
// first, a directory before what is in it, holding one descriptor per
// level (at most MaxPathLen/2 of them) and one batch of entries per
// level; links are not followed. It stops with errdefs.ErrResourceExhausted
// past maxUsageEntries entries or at a path of MaxPathLen bytes. A
// directory that vanishes or changes type during the walk is skipped: the
// sandbox changes the tree as it likes.
func (w *Local) walk(ctx context.Context, fn func(p string, fi fs.FileInfo) error) error {
	return w.walkIn(ctx, w.readDir, fn)
}

// walkSorted is walk with a directory's entries in name order (bytes),
// so paths come in comparePaths order: a whole directory's names are
// read at once (at most maxUsageEntries of them).
func (w *Local) walkSorted(ctx context.Context, fn func(p string, fi fs.FileInfo) error) error {
	return w.walkIn(ctx, w.readDirSorted, fn)
}

func (w *Local) walkIn(ctx context.Context, readDir func(string, func(fs.FileInfo) bool) (bool, error),
	fn func(p string, fi fs.FileInfo) error) error {
	entries := 0
	var walkDir func(dir string) error
	walkDir = func(dir string) error {
		var walkErr error
		_, err := readDir(dir, func(fi fs.FileInfo) bool {
			if walkErr = ctx.Err(); walkErr != nil {
				return false
			}
			if entries++; entries > maxUsageEntries {
				walkErr = fmt.Errorf("workspace has more than %d files and directories: %w", maxUsageEntries, errdefs.ErrResourceExhausted)
				return false
			}
			p := join(dir, fi.Name())
			if len(p) >= MaxPathLen {
				walkErr = fmt.Errorf("workspace has paths longer than %d bytes: %w", MaxPathLen, errdefs.ErrResourceExhausted)
				return false
			}
			if walkErr = fn(p, fi); walkErr == nil && fi.IsDir() {
				walkErr = walkDir(p)
			}
			return walkErr == nil
		})
		if walkErr != nil {
			return walkErr
		}
		if err != nil && (dir == "." || !gone(err)) {
			return fmt.Errorf("path %s: %w", quote(dir), err)
		}
		return nil
	}
	return walkDir(".")
}
