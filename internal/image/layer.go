// Package image makes OCI images (docker-archive tarballs, or pushes to a
// registry) from built templates and from plain files: what a Kubernetes
// node runs a sandbox, the pause container, MinIO, PostgreSQL or sbx
// itself from. See docs/images.md.
package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// IDMap turns a file's owner on disk into its owner in the image.
type IDMap func(uid, gid uint32) (int, int, error)

// idsPerSandbox is the size of a template store's storage id range
// (internal/template): container ids 0..65535 are host ids shift.. .
const idsPerSandbox = 65536

// ShiftIDs maps a template store's storage ids (shift and up) back to the
// sandbox's own (0 for root, 1000 for the sandbox user). An owner outside
// the range means the tree was not made by a build: an error, not a guess.
func ShiftIDs(shift uint32) IDMap {
	return func(uid, gid uint32) (int, int, error) {
		if uid < shift || uid-shift >= idsPerSandbox || gid < shift || gid-shift >= idsPerSandbox {
			return 0, 0, fmt.Errorf("owner %d:%d is not a storage id (%d and up): %w", uid, gid, shift, errdefs.ErrInvalidArgument)
		}
		return int(uid - shift), int(gid - shift), nil
	}
}

// RootIDs gives every file to root: for trees of the host (a --dir),
// whose owners mean nothing in an image.
func RootIDs(uint32, uint32) (int, int, error) { return 0, 0, nil }

// fixedTime is the mtime of what the writer makes up (parent
// directories, added files): a constant, so that the same inputs give the
// same digest. Trees keep their files' own mtimes (Python compares a
// .pyc's recorded source mtime with the source's).
var fixedTime = time.Unix(0, 0).UTC()

// Stats counts what a layer left out.
type Stats struct {
	Entries  int // written
	Skipped  int // devices, FIFOs, sockets, whiteout-named entries
	Hardlink int // written as tar hard links
}

// layerWriter writes one layer's tar stream. Entries come in a fixed
// order (each tree sorted by name), so the same input is the same bytes.
type layerWriter struct {
	ctx   context.Context
	tw    *tar.Writer
	dirs  map[string]bool // directories written, "a/b/"
	names map[string]bool // every path written
	stats Stats
}

func (w *layerWriter) check(name string) error {
	if w.names[name] {
		return fmt.Errorf("%s: twice in one layer: %w", name, errdefs.ErrInvalidArgument)
	}
	w.names[name] = true
	return nil
}

// parents writes the directories above name that are not written yet:
// root's, 0755, so that a layer never depends on a lower one for them
// (and an upper layer's directory replaces a lower layer's link there).
func (w *layerWriter) parents(name string) error {
	dir := path.Dir(strings.TrimSuffix(name, "/"))
	if dir == "." {
		return nil
	}
	if err := w.parents(dir); err != nil {
		return err
	}
	d := dir + "/"
	if w.dirs[d] {
		return nil
	}
	w.dirs[d] = true
	w.names[d] = true
	w.stats.Entries++
	return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: fixedTime})
}

// mode is what an image keeps of a file's mode: permission bits and the
// sticky bit. Set-id bits go, as template builds drop them (a sandbox
// runs with no_new_privs, where they do nothing).
func mode(m uint32) int64 { return int64(m & (0o777 | syscall.S_ISVTX)) }

// cleanDest is an image path as a tar name: relative, cleaned, no "..".
func cleanDest(p string) (string, error) {
	c := strings.TrimPrefix(path.Clean("/"+p), "/")
	if c == "" || strings.HasPrefix(p, "../") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") || p == ".." {
		return "", fmt.Errorf("image path %q: want an absolute file path: %w", p, errdefs.ErrInvalidArgument)
	}
	return c, nil
}

// addFile writes the host file src at dest with the given mode, root's,
// streaming it. A symlink at src is followed (the operator named it);
// anything but a regular file is refused.
func (w *layerWriter) addFile(src, dest string, perm os.FileMode) error {
	name, err := cleanDest(dest)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file: %w", src, errdefs.ErrInvalidArgument)
	}
	if err := w.parents(name); err != nil {
		return err
	}
	if err := w.check(name); err != nil {
		return err
	}
	w.stats.Entries++
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(perm.Perm()), Size: fi.Size(), ModTime: fixedTime}
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	return copyExactly(w.tw, f, fi.Size(), src)
}

// copyExactly copies n bytes: a file that changed size while read is an
// error, not a corrupt tar.
func copyExactly(dst io.Writer, src io.Reader, n int64, name string) error {
	c, err := io.CopyN(dst, src, n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: shrank while read (%d of %d bytes): %w", name, c, n, errdefs.ErrConflict)
		}
		return err
	}
	return nil
}

type inode struct{ dev, ino uint64 }

// addTree writes the tree at src under dest ("" for the image's root).
// It reads src through os.Root: a symlink in the tree is written as a
// symlink and never followed, so no link can make it read a host file
// outside src. Devices, FIFOs and sockets are left out (and never opened
// for reading: a FIFO would block), and so are entries named like
// whiteouts (.wh.*), which a runtime would take as deletions instead of
// files.
func (w *layerWriter) addTree(src, dest string, ids IDMap) error {
	root, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer root.Close()
	prefix := ""
	if dest != "" && dest != "/" {
		p, err := cleanDest(dest)
		if err != nil {
			return err
		}
		prefix = p + "/"
		if err := w.parents(prefix + "x"); err != nil {
			return err
		}
	}
	links := map[inode]string{}
	n := 0
	var walk func(rel string) error
	walk = func(rel string) error {
		d, err := root.Open(rel)
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		slices.Sort(names)
		for _, base := range names {
			if n++; n%1024 == 0 && w.ctx.Err() != nil {
				return context.Cause(w.ctx)
			}
			p := path.Join(rel, base)
			if strings.HasPrefix(base, ".wh.") {
				w.stats.Skipped++
				continue
			}
			isDir, err := w.entry(root, p, prefix, ids, links)
			if err != nil {
				return err
			}
			if isDir {
				if err := walk(p); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(".")
}

// entry writes one entry of a tree; true if it is a directory to descend.
func (w *layerWriter) entry(root *os.Root, p, prefix string, ids IDMap, links map[inode]string) (bool, error) {
	fi, err := root.Lstat(p)
	if err != nil {
		return false, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false, fmt.Errorf("%s: no stat", p)
	}
	uid, gid, err := ids(st.Uid, st.Gid)
	if err != nil {
		return false, fmt.Errorf("/%s: %w", p, err)
	}
	name := prefix + p
	hdr := &tar.Header{Name: name, Mode: mode(st.Mode), Uid: uid, Gid: gid, ModTime: fi.ModTime().Truncate(time.Second).UTC()}
	switch fi.Mode().Type() {
	case fs.ModeDir:
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if err := w.check(hdr.Name); err != nil {
			return false, err
		}
		w.dirs[hdr.Name] = true
		w.stats.Entries++
		return true, w.tw.WriteHeader(hdr)
	case fs.ModeSymlink:
		target, err := root.Readlink(p)
		if err != nil {
			return false, err
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		if err := w.check(name); err != nil {
			return false, err
		}
		w.stats.Entries++
		return false, w.tw.WriteHeader(hdr)
	case 0:
		k := inode{uint64(st.Dev), st.Ino}
		if st.Nlink > 1 {
			if first, ok := links[k]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				if err := w.check(name); err != nil {
					return false, err
				}
				w.stats.Entries++
				w.stats.Hardlink++
				return false, w.tw.WriteHeader(hdr)
			}
			links[k] = name
		}
		return false, w.regular(root, p, hdr, k)
	default:
		w.stats.Skipped++
		return false, nil
	}
}

// regular streams one regular file. It opens without following a final
// link and without blocking (should the entry have been swapped for a
// FIFO since Lstat), and checks that it opened the inode it stat'ed.
func (w *layerWriter) regular(root *os.Root, p string, hdr *tar.Header, k inode) error {
	f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if !fi.Mode().IsRegular() || uint64(st.Dev) != k.dev || st.Ino != k.ino {
		return fmt.Errorf("/%s: changed while read: %w", p, errdefs.ErrConflict)
	}
	hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	if err := w.check(hdr.Name); err != nil {
		return err
	}
	w.stats.Entries++
	if err := w.tw.WriteHeader(hdr); err != nil {
		return err
	}
	return copyExactly(w.tw, f, fi.Size(), "/"+p)
}

// Layer is a layer written to a file, its digests known: what the image
// writers read, as often as they like, without walking the tree again.
type Layer struct {
	file   string
	digest v1.Hash // of the gzip stream
	diffID v1.Hash // of the tar
	size   int64
	Stats  Stats
}

var _ v1.Layer = (*Layer)(nil)

func (l *Layer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *Layer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *Layer) Size() (int64, error)                { return l.size, nil }
func (l *Layer) MediaType() (types.MediaType, error) { return types.DockerLayer, nil }
func (l *Layer) Compressed() (io.ReadCloser, error)  { return os.Open(l.file) }

func (l *Layer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.file)
	if err != nil {
		return nil, err
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{z, f}, nil
}

// LayerSpec is what one layer holds: a tree, files added on top, or both.
type LayerSpec struct {
	// Tree is a directory written at TreeDest ("" or "/" for the root),
	// with owners through IDs (RootIDs if nil).
	Tree     string
	TreeDest string
	IDs      IDMap
	// Files are host files written root's at their destinations.
	Files []File
}

// File is one host file in a layer.
type File struct {
	Src  string
	Dest string
	Mode os.FileMode
}

// gzipLevel trades the export's CPU for the image's size: the fastest
// level, since templates are exported on every build and imported over
// loopback at least as often as they are pushed.
const gzipLevel = gzip.BestSpeed

// WriteLayer writes the layer spec describes to a file in dir, gzip
// compressed, computing both digests in the same pass: a tree of any
// size is read once and streamed, never held in memory.
func WriteLayer(ctx context.Context, dir string, spec LayerSpec) (*Layer, error) {
	f, err := os.CreateTemp(dir, "layer-*.tar.gz")
	if err != nil {
		return nil, err
	}
	l := &Layer{file: f.Name()}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	zsum, tsum := sha256.New(), sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, zsum)}
	z, err := gzip.NewWriterLevel(cw, gzipLevel)
	if err != nil {
		return nil, err
	}
	w := &layerWriter{ctx: ctx, tw: tar.NewWriter(io.MultiWriter(z, tsum)), dirs: map[string]bool{}, names: map[string]bool{}}
	if spec.Tree != "" {
		ids := spec.IDs
		if ids == nil {
			ids = RootIDs
		}
		if err := w.addTree(spec.Tree, spec.TreeDest, ids); err != nil {
			return nil, err
		}
	}
	for _, a := range spec.Files {
		if err := w.addFile(a.Src, a.Dest, a.Mode); err != nil {
			return nil, err
		}
	}
	if err := w.tw.Close(); err != nil {
		return nil, err
	}
	if err := z.Close(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	l.digest, l.diffID, l.size, l.Stats = hashOf(zsum), hashOf(tsum), cw.n, w.stats
	ok = true
	return l, nil
}

// Remove deletes the layer's file.
func (l *Layer) Remove() error { return os.Remove(l.file) }

func hashOf(h hash.Hash) v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", h.Sum(nil))}
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
