package quota

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// removeHeld is how many directory levels RemoveAll keeps open at once
// (two descriptors each).
const removeHeld = 64

// RemoveAll removes path and everything under it, however deep the tree
// sandboxed code made. os.RemoveAll keeps a descriptor open per level and
// fails with EMFILE on a tree of 40,000 nested directories, which then
// stays on the disk for good. RemoveAll keeps at most removeHeld levels
// open: a directory found deeper is moved up into path itself (a rename,
// no copy) and emptied on a later pass. Absent is not an error.
func RemoveAll(path string) error {
	top, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
		return os.Remove(path)
	case err != nil:
		return fmt.Errorf("remove %s: %w", path, err)
	}
	defer unix.Close(top)
	r := remover{top: top}
	for {
		r.progress = 0
		if err := r.empty(top, 0); err != nil {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		err := unix.Rmdir(path)
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
			return nil
		case !errors.Is(err, unix.ENOTEMPTY) || r.progress == 0:
			return fmt.Errorf("remove %s: %w", path, err)
		}
		// Directories moved up into path after this pass read it.
	}
}

type remover struct {
	top      int // the directory being removed
	moved    int // names given to directories moved up into top
	progress int // entries removed or moved in this pass
}

// empty removes what the directory open at fd holds, depth levels below
// top. Directories at removeHeld levels are moved up into top instead, to
// be emptied later in this pass or the next.
func (r *remover) empty(fd, depth int) error {
	// A description of its own: a dup would share fd's offset, and a
	// second pass over top would start where the first ended.
	own, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	dir := os.NewFile(uintptr(own), "")
	defer dir.Close()
	for {
		entries, err := dir.ReadDir(1024)
		for _, e := range entries {
			name := e.Name()
			r.progress++
			if !e.IsDir() {
				if err := unix.Unlinkat(fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
					return err
				}
				continue
			}
			if depth+1 >= removeHeld {
				if err := r.moveUp(fd, name); err != nil {
					return err
				}
				continue
			}
			child, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			err = r.empty(child, depth+1)
			unix.Close(child)
			if err != nil {
				return err
			}
			if err := unix.Unlinkat(fd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// moveUp renames the directory name in fd into top, under a new name.
func (r *remover) moveUp(fd int, name string) error {
	for {
		r.moved++
		to := ".deep-" + strconv.Itoa(r.moved)
		err := unix.Renameat2(fd, name, r.top, to, unix.RENAME_NOREPLACE)
		if !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
}
