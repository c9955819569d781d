package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A client's write, move or remove is decided on the file it would really
// change, not on the text of its path. Reads may follow links that stay
// inside (os.Root does); changes may not: the sandbox can plant
// "x -> uploads" and have a client write x/c1/temparea/doc.pdf, or rename
// sbx's uploads/ to x. So a change opens the directories on its path one
// at a time from the workspace's descriptor, with O_NOFOLLOW, refuses a
// link among them, judges the directory it reached by what it is (its
// name at the top of the workspace, and its owner), and then acts inside
// that open directory by name (openat, renameat, unlinkat): swapping names
// after the check cannot redirect it.
//
// What the sandbox can do to the managed directories, and why the owner
// is checked too: uploads/ and .resources/ belong to the sandbox's root
// (mode 0755), so sandboxed code (uid 1000) cannot add, change or remove
// anything in them, nor move them into another directory (that needs
// write permission on the directory moved). It owns the workspace
// directory, though, so it can rename them at the top (uploads -> x) and
// put its own in their place. A renamed one is still root's, and nothing
// else at the top is: the sandbox cannot give a file to its root. So at
// the top of the workspace a directory named uploads or .resources, or
// owned by the sandbox's root, is sbx's, whatever its name.

// area is the part of the workspace an operation may change: the user's
// files, or one of the directories sbx manages, for sbx's own calls
// (conversation uploads, resource sync).
type area string

const (
	userArea      area = ""
	uploadsArea   area = uploadsDir
	resourcesArea area = ResourcesDir
)

// mkdirs says that resolve makes missing directories, with this owner and
// mode.
type mkdirs struct {
	owner Owner
	perm  fs.FileMode
}

// parentDir is the open directory an operation acts in, and the name it
// acts on there.
type parentDir struct {
	dir  *os.File
	name string
	rel  string // the whole path, for messages
	top  bool   // dir is the workspace itself
}

func (p *parentDir) fd() int { return int(p.dir.Fd()) }

func (p *parentDir) close() { p.dir.Close() }

// lstat describes what is at the name, without following a link.
func (p *parentDir) lstat() (*unix.Stat_t, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(p.fd(), p.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, err
	}
	return &st, nil
}

// resolve opens the parent directory of rel (a CleanPath result, not ".")
// for an operation in area a, without following links, and checks that
// the operation stays in a. With mk, missing directories are made.
func (w *Local) resolve(rel string, a area, mk *mkdirs) (*parentDir, error) {
	if rel == "." {
		return nil, badPath(rel, "the workspace itself cannot be changed")
	}
	comps := strings.Split(rel, "/")
	if a != userArea && a != archiveArea && (comps[0] != string(a) || len(comps) < 2) {
		return nil, badPath(rel, fmt.Sprintf("not below %s/", a))
	}
	dir, err := w.root.OpenFile(".", os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, classify(rel, err)
	}
	for i, c := range comps[:len(comps)-1] {
		// By name before anything is made: a write to uploads/x while
		// the sandbox has renamed uploads away must not make one.
		if why := Managed(c); i == 0 && a == userArea && why != "" {
			dir.Close()
			return nil, fmt.Errorf("path %s: %s: %w", quote(rel), why, errdefs.ErrInvalidArgument)
		}
		sub, made, err := openDir(dir, c, mk)
		if err != nil {
			dir.Close()
			return nil, w.componentError(rel, strings.Join(comps[:i+1], "/"), err)
		}
		dir.Close()
		dir = sub
		if made {
			if err := w.adoptFile(sub, mk.owner, mk.perm); err != nil {
				dir.Close()
				return nil, dirError(strings.Join(comps[:i+1], "/"), err)
			}
		}
		if i == 0 && a == userArea {
			if why := w.managedEntry(sub); why != "" {
				dir.Close()
				return nil, fmt.Errorf("path %s: %s: %w", quote(rel), why, errdefs.ErrInvalidArgument)
			}
		}
	}
	p := &parentDir{dir: dir, name: comps[len(comps)-1], rel: rel, top: len(comps) == 1}
	if p.top && a == userArea {
		if why := w.managedName(p); why != "" {
			p.close()
			return nil, fmt.Errorf("path %s: %s: %w", quote(rel), why, errdefs.ErrInvalidArgument)
		}
	}
	return p, nil
}

// openDir opens the directory name in dir without following a link; with
// mk it makes it first if it is missing (made says so).
func openDir(dir *os.File, name string, mk *mkdirs) (_ *os.File, made bool, _ error) {
	const flags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(int(dir.Fd()), name, flags, 0)
	if errors.Is(err, unix.ENOENT) && mk != nil {
		err = unix.Mkdirat(int(dir.Fd()), name, uint32(mk.perm.Perm()))
		made = err == nil
		if err == nil || errors.Is(err, unix.EEXIST) {
			fd, err = unix.Openat(int(dir.Fd()), name, flags, 0)
		}
	}
	if err != nil {
		return nil, false, err
	}
	return os.NewFile(uintptr(fd), name), made, nil
}

// componentError explains why the directory at sub, on the way to rel,
// could not be opened: a link (refused, not followed) or a file is the
// client's to fix.
func (w *Local) componentError(rel, sub string, err error) error {
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		if fi, lerr := w.root.Lstat(sub); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("path %s: %s is a symbolic link: files are written, moved and removed only by their real path, never through a link: %w",
				quote(rel), quote(sub), errdefs.ErrInvalidArgument)
		}
		return badPath(sub, "is not a directory")
	}
	if errors.Is(err, unix.EEXIST) {
		return badPath(sub, "is not a directory")
	}
	return classify(sub, err)
}

// adoptFile gives a directory resolve just made its owner and mode. If
// the sandbox swapped the name in the meantime, the directory is not ours
// and is left alone rather than handed to owner.
func (w *Local) adoptFile(d *os.File, owner Owner, perm fs.FileMode) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return err
	}
	if int(st.Uid) != os.Geteuid() {
		return nil
	}
	if err := d.Chown(owner.UID, owner.GID); err != nil {
		return err
	}
	return d.Chmod(perm)
}

// managedEntry says why the directory d, opened at the top of the
// workspace (under a name that is not sbx's), is sbx's all the same, or
// "" when it is the user's.
func (w *Local) managedEntry(d *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return "cannot be checked: " + err.Error()
	}
	return w.rootOwned(&st)
}

// managedName says why the name p acts on at the top of the workspace is
// sbx's (to replace, move or remove), or "" when it is the user's.
func (w *Local) managedName(p *parentDir) string {
	if why := Managed(p.name); why != "" {
		return why
	}
	st, err := p.lstat()
	if err != nil {
		return "" // nothing there (yet): the operation says
	}
	return w.rootOwned(st)
}

func (w *Local) rootOwned(st *unix.Stat_t) string {
	if w.owners.Root == w.owners.User || int(st.Uid) != w.owners.Root.UID {
		return ""
	}
	return "belongs to the sandbox's root: it is sbx's uploads/ or .resources/ under another name (sandboxed code renamed it)"
}

// removeAt removes name in dir, a directory with everything in it. It
// never follows a link: each directory is opened with O_NOFOLLOW from its
// parent's descriptor.
func removeAt(dir *os.File, name string) error {
	dfd := int(dir.Fd())
	err := unix.Unlinkat(dfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) && !errors.Is(err, unix.EPERM) {
		return err
	}
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		// Swapped for a file or a link since: remove that instead.
		return unix.Unlinkat(dfd, name, 0)
	}
	if err != nil {
		return err
	}
	sub := os.NewFile(uintptr(fd), name)
	defer sub.Close()
	// Entries are removed under the reader, so it starts over after each
	// batch until none is left. Code still writing into the directory
	// could keep that going forever: a few passes that saw the whole
	// directory are all it gets.
	for passes := 0; ; {
		const batch = 1024
		names, err := sub.Readdirnames(batch)
		if len(names) == 0 {
			if err != nil && err != io.EOF {
				return err
			}
			break
		}
		if len(names) < batch {
			if passes++; passes > 8 {
				return fmt.Errorf("%s keeps changing while it is removed: %w", name, errdefs.ErrFailedPrecondition)
			}
		}
		for _, n := range names {
			if err := removeAt(sub, n); err != nil {
				return err
			}
		}
		if _, err := sub.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	err = unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
