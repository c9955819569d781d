package workspace

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// The archive of a workspace (Export, Import) is a tar stream (PAX) of its
// directories, regular files and symbolic links, parents before children,
// in path order (a directory's entries sorted by name right after it, the
// order of a snapshot's manifest: internal/snapshot's SaveArchive refuses
// any other). It is the same whichever implementation wrote it, so a
// workspace exported on one node imports on another: owners are the
// sandbox's own ids (0 for what its root owns, uploads/ and .resources/;
// 1000 for the rest), never the host's; modes are permission bits only
// (no setuid, setgid or sticky bit); FIFOs, sockets and devices are left
// out. Directories' times are not kept (adding their entries changes
// them).
//
// An archive is input: one may come from a sandbox (its executor writes
// it) or from a blob store. Import checks every entry: a clean relative
// path, one of the three types, a link target of at most MaxPathLen bytes,
// at most MaxArchiveEntries entries; it writes through the same
// link-refusing resolution as Save, so an entry can neither follow a link
// the archive made earlier nor reach outside the workspace. Its bytes are
// bounded by the workspace's disk limit, which the volume enforces.

// MaxArchiveEntries bounds the entries of an archive, as Usage bounds a
// walk.
const MaxArchiveEntries = maxUsageEntries

// Archive owners: the ids inside every sandbox.
const (
	archiveRootID = 0
	archiveUserID = 1000
)

// archiveArea lets Import write anywhere, uploads/ and .resources/
// included: it restores a whole workspace, sbx's directories with it.
const archiveArea area = "*"

// Export writes the workspace as an archive to w. Entries that vanish or
// change type during the walk are left out; a file that shrinks is padded
// with zeros and one that grows is cut at the size it had when opened, so
// the stream stays well formed while the sandbox writes.
func (w *Local) Export(ctx context.Context, out io.Writer) error {
	tw := tar.NewWriter(out)
	x := exporter{ctx: ctx, w: w, tw: tw}
	if err := w.walkSorted(ctx, x.entry); err != nil {
		return err
	}
	return tw.Close()
}

type exporter struct {
	ctx context.Context
	w   *Local
	tw  *tar.Writer
}

func (x *exporter) header(p string, fi fs.FileInfo) *tar.Header {
	id := archiveUserID
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && x.w.owners.Root != x.w.owners.User && int(st.Uid) == x.w.owners.Root.UID {
		id = archiveRootID
	}
	return &tar.Header{
		Name: p, Mode: int64(fi.Mode().Perm()), Uid: id, Gid: id,
		ModTime: fi.ModTime(), Format: tar.FormatPAX,
	}
}

func (x *exporter) entry(p string, fi fs.FileInfo) error {
	switch m := fi.Mode(); {
	case m.IsDir():
		h := x.header(p+"/", fi)
		h.Typeflag, h.ModTime = tar.TypeDir, time.Time{}
		return x.tw.WriteHeader(h)
	case m&fs.ModeSymlink != 0:
		target, err := x.w.root.Readlink(p)
		if err != nil {
			return nil // changed since it was listed
		}
		h := x.header(p, fi)
		h.Typeflag, h.Linkname = tar.TypeSymlink, target
		return x.tw.WriteHeader(h)
	case m.IsRegular():
		if strings.HasPrefix(fi.Name(), tempPrefix) {
			return nil // a Save in progress
		}
		return x.file(p)
	}
	return nil // FIFOs, sockets, devices
}

// file writes the regular file at p as it is once opened.
func (x *exporter) file(p string) error {
	f, err := x.w.root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil // gone, or a link or FIFO now
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	h := x.header(p, fi)
	h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	if err := x.tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.Copy(x.tw, io.LimitReader(ctxReader{x.ctx, f}, fi.Size()))
	if err != nil {
		if errors.As(err, new(readError)) && x.ctx.Err() != nil {
			return x.ctx.Err()
		}
		return fmt.Errorf("path %s: %w", quote(p), err)
	}
	if n < fi.Size() { // it shrank meanwhile
		_, err = io.CopyN(x.tw, zeros{}, fi.Size()-n)
	}
	return err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Import replaces the workspace's content with the archive in r. On an
// error the workspace holds part of it: import into a new workspace and
// put it in place only once Import succeeds (as restores do).
func (w *Local) Import(ctx context.Context, r io.Reader) error {
	if err := w.clear(); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("workspace archive: %v: %w", err, errdefs.ErrInvalidArgument)
		}
		if n >= MaxArchiveEntries {
			return fmt.Errorf("workspace archive: more than %d entries: %w", MaxArchiveEntries, errdefs.ErrResourceExhausted)
		}
		if err := w.importEntry(ctx, h, tr); err != nil {
			return fmt.Errorf("workspace archive: %w", err)
		}
	}
	// The archive may have had none, or a file in its place.
	return w.ensureUploads()
}

// clear removes everything in the workspace.
func (w *Local) clear() error {
	top, err := w.root.OpenFile(".", os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer top.Close()
	names, err := top.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeAt(top, n); err != nil {
			return classify(n, err)
		}
	}
	return nil
}

func (w *Local) importEntry(ctx context.Context, h *tar.Header, body io.Reader) error {
	rel, err := CleanPath(strings.TrimSuffix(h.Name, "/"))
	if err != nil {
		return err
	}
	if rel == "." {
		return nil
	}
	owner := w.owners.User
	if h.Uid == archiveRootID {
		owner = w.owners.Root
	}
	perm := fs.FileMode(h.Mode).Perm()
	p, err := w.resolve(rel, archiveArea, &mkdirs{w.owners.User, 0o755})
	if err != nil {
		return err
	}
	defer p.close()
	// An entry replaces whatever an earlier one put at its path; a
	// directory that is there already is kept.
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(p.fd(), p.name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return classify(rel, err)
		}
		d, _, err := openDir(p.dir, p.name, nil)
		if err != nil {
			return w.componentError(rel, rel, err)
		}
		defer d.Close()
		if err := d.Chown(owner.UID, owner.GID); err != nil {
			return err
		}
		return d.Chmod(perm)
	case tar.TypeSymlink:
		if len(h.Linkname) == 0 || len(h.Linkname) >= MaxPathLen || strings.IndexByte(h.Linkname, 0) >= 0 {
			return badPath(rel, "is a link with an empty, overlong or malformed target")
		}
		if err := removeAt(p.dir, p.name); err != nil {
			return classify(rel, err)
		}
		if err := unix.Symlinkat(h.Linkname, p.fd(), p.name); err != nil {
			return classify(rel, err)
		}
		if err := unix.Fchownat(p.fd(), p.name, owner.UID, owner.GID, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return setTimes(p, h.ModTime)
	case tar.TypeReg:
		if h.Size < 0 {
			return badPath(rel, "has a negative size")
		}
		if err := removeAt(p.dir, p.name); err != nil {
			return classify(rel, err)
		}
		fd, err := unix.Openat(p.fd(), p.name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return classify(rel, err)
		}
		f := os.NewFile(uintptr(fd), rel)
		defer f.Close()
		n, err := io.Copy(f, ctxReader{ctx, body})
		switch {
		case errors.As(err, new(readError)):
			return fmt.Errorf("path %s: %v: %w", quote(rel), err, errdefs.ErrInvalidArgument)
		case err != nil:
			return classify(rel, err)
		case n != h.Size:
			return badPath(rel, "is cut short")
		}
		if err := f.Chown(owner.UID, owner.GID); err != nil {
			return err
		}
		if err := f.Chmod(perm); err != nil {
			return err
		}
		return setTimes(p, h.ModTime)
	}
	return badPath(rel, fmt.Sprintf("is of a type (%q) a workspace archive does not hold", h.Typeflag))
}

// setTimes sets the modification time of the name p acts on, a link
// itself if it is one.
func setTimes(p *parentDir, mtime time.Time) error {
	ts := unix.NsecToTimespec(mtime.UnixNano())
	return unix.UtimesNanoAt(p.fd(), p.name, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW)
}
