package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Resources are named, read-only files a client keeps in step with
// a manifest: skills, commands, reference data. They live under
// ResourcesDir, which belongs to the sandbox's root like uploads/, so user
// code can read them but not change them. The directory also holds the
// record of what is in place (resourcesRecord), so a snapshot or a
// hibernation carries the files and the record together.
const (
	// ResourcesDir is the resources' directory in the workspace; the
	// sandbox sees it at /workspace/.resources.
	ResourcesDir    = ".resources"
	resourcesRecord = ResourcesDir + "/.sbx-manifest.json"
	// MaxResources bounds a manifest's entries.
	MaxResources = 1000
	// maxRecord bounds the record read back (a sandbox cannot write it,
	// but a restored snapshot could carry anything).
	maxRecord = 4 << 20
)

// Resource is one entry of a manifest: a workspace-style path below
// ResourcesDir and the SHA-256 and size of its content.
type Resource struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// ResourceSync says what SyncResources did.
type ResourceSync struct {
	// Needed are the resources whose content the caller must provide
	// before they can be put in place; an entry that changed keeps its
	// old content until then.
	Needed []Resource
	// Added, Changed and Removed name what this call put in place or
	// took away; Unchanged counts the rest.
	Added, Changed, Removed []string
	Unchanged               int
}

// CheckManifest validates a client's manifest and returns it sorted by
// name: valid paths (not ResourcesDir itself, no component starting with
// ".sbx-"), lower-case hex SHA-256s, sizes >= 0, no name twice and none
// that is a directory of another.
func CheckManifest(m []Resource) ([]Resource, error) {
	if len(m) > MaxResources {
		return nil, fmt.Errorf("manifest of %d resources: at most %d: %w", len(m), MaxResources, errdefs.ErrInvalidArgument)
	}
	out := make([]Resource, len(m))
	for i, r := range m {
		name, err := CleanPath(r.Name)
		if err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		if name == "." {
			return nil, fmt.Errorf("resource %d: name %q names no file: %w", i, r.Name, errdefs.ErrInvalidArgument)
		}
		if strings.HasPrefix(name, ".sbx-") || strings.Contains(name, "/.sbx-") {
			return nil, fmt.Errorf("resource %s: names starting with .sbx- are sbx's own: %w", quote(name), errdefs.ErrInvalidArgument)
		}
		if !validSHA256(r.SHA256) {
			return nil, fmt.Errorf("resource %s: sha256 %q: want 64 lower-case hex digits: %w", quote(name), r.SHA256, errdefs.ErrInvalidArgument)
		}
		if r.Size < 0 {
			return nil, fmt.Errorf("resource %s: negative size: %w", quote(name), errdefs.ErrInvalidArgument)
		}
		out[i] = Resource{Name: name, SHA256: r.SHA256, Size: r.Size}
	}
	slices.SortFunc(out, func(a, b Resource) int { return strings.Compare(a.Name, b.Name) })
	names := make(map[string]bool, len(out))
	for _, r := range out {
		if names[r.Name] {
			return nil, fmt.Errorf("resource %s: named twice: %w", quote(r.Name), errdefs.ErrInvalidArgument)
		}
		names[r.Name] = true
	}
	for _, r := range out {
		for d := path.Dir(r.Name); d != "."; d = path.Dir(d) {
			if names[d] {
				return nil, fmt.Errorf("resource %s: %s is a file, so it cannot be a directory too: %w", quote(r.Name), quote(d), errdefs.ErrInvalidArgument)
			}
		}
	}
	return out, nil
}

func validSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Resources returns the resources in place, sorted by name.
func (w *Local) Resources(ctx context.Context) ([]Resource, error) {
	rec, ok := w.readRecord()
	if !ok {
		return []Resource{}, nil
	}
	return rec, nil
}

// readRecord reads the record of the resources in place; ok is false if
// there is none, or if ResourcesDir is not what sbx made (the sandbox
// renamed it away and made its own), in which case nothing there can be
// trusted.
func (w *Local) readRecord() (rec []Resource, ok bool) {
	if !w.ownedByRoot(ResourcesDir) || !w.ownedByRoot(resourcesRecord) {
		return nil, false
	}
	f, err := w.root.OpenFile(resourcesRecord, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxRecord+1))
	if err != nil || len(b) > maxRecord {
		return nil, false
	}
	var r struct {
		Resources []Resource `json:"resources"`
	}
	if json.Unmarshal(b, &r) != nil {
		return nil, false
	}
	if rec, err = CheckManifest(r.Resources); err != nil {
		return nil, false
	}
	return rec, true
}

// ownedByRoot says whether rel (not followed if a link) belongs to the
// sandbox's root.
func (w *Local) ownedByRoot(rel string) bool {
	fi, err := w.root.Lstat(rel)
	if err != nil {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == w.owners.Root.UID && fi.Mode().Type()&fs.ModeSymlink == 0
}

// ResourceContent opens the content whose SHA-256 is sum and says its
// size: errdefs.ErrNotFound if the caller has none.
type ResourceContent func(ctx context.Context, sum string) (io.ReadCloser, int64, error)

// SyncResources brings ResourcesDir in step with want (checked by
// CheckManifest): resources that are gone from want are removed, new and
// changed ones are copied in from content, and the rest (content has
// none) is reported as Needed. Each file is written in a temporary file
// of its directory and renamed into place, owned by the sandbox's root
// and read-only, and its content is checked against its hash on the way.
//
// Callers serialize SyncResources calls on one workspace.
func (w *Local) SyncResources(ctx context.Context, want []Resource, content ResourceContent) (ResourceSync, error) {
	var res ResourceSync
	have, ok := w.readRecord()
	if !ok {
		// Nothing sbx made is there: start from an empty directory.
		if err := w.root.RemoveAll(ResourcesDir); err != nil {
			return res, classify(ResourcesDir, err)
		}
		have = nil
	}
	if err := w.rootDir(ResourcesDir); err != nil {
		return res, err
	}
	old := make(map[string]Resource, len(have))
	for _, r := range have {
		old[r.Name] = r
	}
	// What the record has is in place: the sandbox cannot change what is
	// below a directory of its root, and a directory it made instead
	// fails readRecord. So an unchanged manifest reads one file. The
	// content of the others is opened up front, so that a manifest that
	// is wrong about a size fails before anything changes.
	wanted := make(map[string]bool, len(want))
	opened := map[string]io.ReadCloser{}
	defer func() {
		for _, rc := range opened {
			rc.Close()
		}
	}()
	for _, r := range want {
		wanted[r.Name] = true
		if prev, ok := old[r.Name]; ok && prev == r {
			continue
		}
		rc, size, err := content(ctx, r.SHA256)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return res, fmt.Errorf("resource %s: %w", quote(r.Name), err)
		}
		opened[r.Name] = rc
		if size != r.Size {
			return res, fmt.Errorf("resource %s: the manifest says %d bytes, its content has %d: %w", quote(r.Name), r.Size, size, errdefs.ErrInvalidArgument)
		}
	}
	// Removals first: a name that was a file may be a directory now.
	var kept []Resource
	for _, r := range have {
		if wanted[r.Name] {
			continue
		}
		rel := ResourcesDir + "/" + r.Name
		if err := w.root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, classify(rel, err)
		}
		w.pruneDirs(path.Dir(rel))
		res.Removed = append(res.Removed, r.Name)
	}
	for _, r := range want {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		rel := ResourcesDir + "/" + r.Name
		prev, existed := old[r.Name]
		if existed && prev == r {
			kept = append(kept, r)
			res.Unchanged++
			continue
		}
		src, ok := opened[r.Name]
		if !ok {
			res.Needed = append(res.Needed, r)
			if existed && w.inPlace(rel, prev.Size) {
				kept = append(kept, prev)
			}
			continue
		}
		err := w.placeResource(ctx, rel, src, r)
		src.Close() // what it holds goes now, not after the last resource
		delete(opened, r.Name)
		if err != nil {
			return res, err
		}
		kept = append(kept, r)
		if existed {
			res.Changed = append(res.Changed, r.Name)
		} else {
			res.Added = append(res.Added, r.Name)
		}
	}
	if !ok || len(res.Removed)+len(res.Added)+len(res.Changed) > 0 || len(kept) != len(have) {
		if err := w.writeRecord(ctx, kept); err != nil {
			return res, err
		}
		// One sync for the files placed and the record that names them
		// (resource saves skip their own).
		if err := w.syncFS(); err != nil {
			return res, classify(ResourcesDir, err)
		}
	}
	return res, nil
}

// syncFS makes everything written to the workspace's file system durable.
func (w *Local) syncFS() error {
	f, err := w.root.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// inPlace says whether rel is a regular file of size bytes.
func (w *Local) inPlace(rel string, size int64) bool {
	fi, err := w.root.Lstat(rel)
	return err == nil && fi.Mode().IsRegular() && fi.Size() == size
}

// rootDir makes rel a directory of the sandbox's root, mode 0755.
func (w *Local) rootDir(rel string) error {
	if err := w.root.Mkdir(rel, uploadsMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return classify(rel, err)
	}
	f, err := w.root.OpenFile(rel, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return classify(rel, err)
	}
	defer f.Close()
	if err := f.Chown(w.owners.Root.UID, w.owners.Root.GID); err != nil {
		return classify(rel, err)
	}
	return classify(rel, f.Chmod(uploadsMode))
}

// placeResource copies the content src of resource r to rel, read-only
// and owned by the sandbox's root (save: no link followed on the way, a
// temporary file renamed into place). Content that is not r's (a store
// that lost or changed it) fails the sync before the rename.
func (w *Local) placeResource(ctx context.Context, rel string, src io.Reader, r Resource) error {
	_, err := w.save(ctx, rel, resourcesArea, &checkedReader{r: src, h: sha256.New(), want: r}, r.Size+1, w.owners.Root, 0o444)
	return err
}

// checkedReader reads a resource's content and fails at its end if that
// is not the content the resource names.
type checkedReader struct {
	r    io.Reader
	h    hash.Hash
	n    int64
	want Resource
}

func (c *checkedReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	if err == io.EOF {
		if sum := hex.EncodeToString(c.h.Sum(nil)); c.n != c.want.Size || sum != c.want.SHA256 {
			return n, fmt.Errorf("resource %s: the stored content has %d bytes hashing to %s, not %d bytes hashing to %s",
				quote(c.want.Name), c.n, sum, c.want.Size, c.want.SHA256)
		}
	}
	return n, err
}

// pruneDirs removes dirRel and its parents up to ResourcesDir while they
// are empty.
func (w *Local) pruneDirs(dirRel string) {
	for dirRel != ResourcesDir && strings.HasPrefix(dirRel, ResourcesDir+"/") {
		if w.root.Remove(dirRel) != nil { // not empty (or gone)
			return
		}
		dirRel = path.Dir(dirRel)
	}
}

func (w *Local) writeRecord(ctx context.Context, rec []Resource) error {
	if rec == nil {
		rec = []Resource{}
	}
	b, err := json.Marshal(struct {
		Resources []Resource `json:"resources"`
	}{rec})
	if err != nil {
		return err
	}
	_, err = w.save(ctx, resourcesRecord, resourcesArea, bytes.NewReader(b), 0, w.owners.Root, 0o444)
	return err
}
