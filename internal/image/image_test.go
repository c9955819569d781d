package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

const shift = 200000

// entry is what a test checks of a tar entry.
type entry struct {
	hdr  *tar.Header
	data string
}

func readTar(t *testing.T, r io.Reader) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = entry{h, string(b)}
	}
}

func layerEntries(t *testing.T, l v1.Layer) map[string]entry {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	return readTar(t, rc)
}

func flatten(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	return readTar(t, rc)
}

// tree makes a rootfs the way a build leaves it: owned by storage ids.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	testenv.RequiresRoot(t)
	dir := t.TempDir()
	for p, content := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(content, "->"):
			err := os.Symlink(strings.TrimPrefix(content, "->"), full)
			if err != nil {
				t.Fatal(err)
			}
		case content == "<dir>":
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
		default:
			if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	chownAll(t, dir, shift)
	return dir
}

func chownAll(t *testing.T, dir string, id int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, id, id)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func writeLayer(t *testing.T, spec LayerSpec) *Layer {
	t.Helper()
	l, err := WriteLayer(context.Background(), t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestTreeLayerKeepsSandboxIDsModesAndLinks(t *testing.T) {
	dir := tree(t, map[string]string{
		"etc/os-release":     "debian\n",
		"home/user/notes":    "mine",
		"usr/bin/python3":    "->python3.11",
		"usr/bin/python3.11": "ELF",
		"tmp":                "<dir>",
	})
	// The sandbox user's file, a sticky /tmp, a setuid binary, a hard
	// link, and things an image must not hold.
	if err := os.Lchown(filepath.Join(dir, "home/user/notes"), shift+1000, shift+1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "home/user/notes"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(filepath.Join(dir, "usr/bin/python3.11"), 0o6755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "usr/bin/python3.11"), filepath.Join(dir, "usr/bin/py")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "tmp/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(filepath.Join(dir, "tmp/null"), syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tmp/.wh.x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	chownAll(t, filepath.Join(dir, "tmp"), shift)

	l := writeLayer(t, LayerSpec{Tree: dir, IDs: ShiftIDs(shift)})
	got := layerEntries(t, l)

	for _, name := range []string{"tmp/fifo", "tmp/null", "tmp/.wh.x"} {
		if _, ok := got[name]; ok {
			t.Errorf("%s is in the layer", name)
		}
	}
	if l.Stats.Skipped != 3 {
		t.Errorf("skipped %d, want 3", l.Stats.Skipped)
	}
	if e := got["etc/os-release"]; e.hdr == nil || e.hdr.Uid != 0 || e.hdr.Gid != 0 || e.data != "debian\n" || e.hdr.Mode != 0o644 {
		t.Errorf("etc/os-release: %+v", e)
	}
	if e := got["home/user/notes"]; e.hdr == nil || e.hdr.Uid != 1000 || e.hdr.Gid != 1000 || e.hdr.Mode != 0o600 {
		t.Errorf("home/user/notes: %+v", e.hdr)
	}
	if e := got["tmp"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o1777 {
		t.Errorf("tmp: %+v", e.hdr)
	}
	if e := got["usr/bin/python3"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeSymlink || e.hdr.Linkname != "python3.11" {
		t.Errorf("usr/bin/python3: %+v", e.hdr)
	}
	// py sorts before python3.11: the first name of the inode is the file.
	if e := got["usr/bin/py"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeReg || e.data != "ELF" || e.hdr.Mode != 0o755 {
		t.Errorf("usr/bin/py: %+v", e.hdr)
	}
	if e := got["usr/bin/python3.11"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeLink || e.hdr.Linkname != "usr/bin/py" {
		t.Errorf("usr/bin/python3.11: %+v", e.hdr)
	}
	for name, e := range got {
		if e.hdr.Uname != "" || e.hdr.Gname != "" {
			t.Errorf("%s names its owner %q:%q", name, e.hdr.Uname, e.hdr.Gname)
		}
	}
}

func TestTreeLayerRefusesHostOwners(t *testing.T) {
	dir := tree(t, map[string]string{"etc/x": "x"})
	if err := os.Lchown(filepath.Join(dir, "etc/x"), 0, 0); err != nil {
		t.Fatal(err)
	}
	_, err := WriteLayer(context.Background(), t.TempDir(), LayerSpec{Tree: dir, IDs: ShiftIDs(shift)})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a host-owned file: %v, want ErrInvalidArgument", err)
	}
}

// A rootfs is tenant-built: its links point wherever the tenant likes.
// The exporter writes them as links and never reads through them.
func TestTreeLayerNeverFollowsLinksOutOfTheTree(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(secret, []byte("root:SECRET-HASH:"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := tree(t, map[string]string{
		"etc/shadow":   "->/etc/shadow",
		"etc/host":     "->" + secret,
		"etc/up":       "->../../../../../../../.." + secret,
		"hostetc":      "->/etc",
		"secretdir":    "->" + filepath.Dir(secret),
		"usr/lib/file": "ok",
	})
	l := writeLayer(t, LayerSpec{Tree: dir, IDs: ShiftIDs(shift)})
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("SECRET-HASH")) {
		t.Fatal("the layer holds a host file read through a link")
	}
	shadow, _ := os.ReadFile("/etc/shadow")
	if line, _, _ := bytes.Cut(shadow, []byte("\n")); len(line) > 8 && bytes.Contains(raw, line) {
		t.Fatal("the layer holds /etc/shadow")
	}
	got := readTar(t, bytes.NewReader(raw))
	for _, name := range []string{"etc/shadow", "etc/host", "etc/up", "hostetc", "secretdir"} {
		if e := got[name]; e.hdr == nil || e.hdr.Typeflag != tar.TypeSymlink {
			t.Errorf("%s: %+v, want a symlink", name, e.hdr)
		}
	}
	for name := range got {
		if strings.HasPrefix(name, "hostetc/") || strings.HasPrefix(name, "secretdir/") {
			t.Errorf("%s: the walk went through a link", name)
		}
	}
}

// fakeExecutor is a stand-in binary: the layer only copies it.
func fakeExecutor(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sbx-executor")
	if err := os.WriteFile(p, []byte(content), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

func templateImage(t *testing.T, rootfs, exe string) *Image {
	t.Helper()
	store := template.NewStore(t.TempDir())
	store.UIDShift = shift
	tp := &template.Template{Spec: template.Spec{Name: "py"}, Hash: strings.Repeat("ab", 32), Rootfs: rootfs}
	img, err := Template(context.Background(), t.TempDir(), store, tp, exe)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { img.Close() })
	return img
}

// Whatever a template puts at /opt/sbx, the image's executor is the real
// one: the executor is the top layer.
func TestTemplateCannotReplaceTheExecutor(t *testing.T) {
	exe := fakeExecutor(t, "REAL-EXECUTOR")
	cases := map[string]map[string]string{
		"opt/sbx is a link":      {"opt/sbx": "->/etc", "etc/sbx-executor": "EVIL"},
		"opt is a link":          {"opt": "->tmp", "tmp/sbx/sbx-executor": "EVIL"},
		"the executor is a file": {"opt/sbx/sbx-executor": "EVIL"},
		"the executor is a link": {"opt/sbx/sbx-executor": "->/bin/sh", "bin/sh": "EVIL"},
		"opt/sbx is a file":      {"opt/sbx": "EVIL"},
		"a whiteout and an opaque dir": {
			"opt/sbx/.wh.sbx-executor": "", "opt/sbx/.wh..wh..opq": "", "opt/.wh.sbx": "",
		},
	}
	for name, files := range cases {
		t.Run(name, func(t *testing.T) {
			img := templateImage(t, tree(t, files), exe)
			got := flatten(t, img)
			e := got["opt/sbx/sbx-executor"]
			if e.hdr == nil || e.hdr.Typeflag != tar.TypeReg || e.data != "REAL-EXECUTOR" || e.hdr.Mode != 0o755 || e.hdr.Uid != 0 {
				t.Fatalf("opt/sbx/sbx-executor: %+v %q", e.hdr, e.data)
			}
			for _, d := range []string{"opt", "opt/sbx"} {
				if e := got[d]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir {
					t.Fatalf("%s: %+v, want a directory", d, e.hdr)
				}
			}
		})
	}
}

func TestTemplateImageIsDeterministicAndSharesTheExecutorLayer(t *testing.T) {
	exe := fakeExecutor(t, "REAL-EXECUTOR")
	rootfs := tree(t, map[string]string{"usr/bin/python3": "ELF", "workspace": "<dir>", "opt/sbx": "<dir>"})
	other := tree(t, map[string]string{"usr/bin/node": "ELF"})
	a, b, c := templateImage(t, rootfs, exe), templateImage(t, rootfs, exe), templateImage(t, other, exe)
	da, _ := a.Digest()
	db, _ := b.Digest()
	dc, _ := c.Digest()
	if da != db {
		t.Fatalf("one rootfs, two digests: %s %s", da, db)
	}
	if da == dc {
		t.Fatal("two rootfs, one digest")
	}
	la, _ := a.Layers()
	lc, _ := c.Layers()
	if len(la) != 2 || len(lc) != 2 {
		t.Fatalf("%d and %d layers, want 2", len(la), len(lc))
	}
	ea, _ := la[1].Digest()
	ec, _ := lc[1].Digest()
	if ea != ec {
		t.Fatalf("the executor layer differs between templates: %s %s", ea, ec)
	}
	cf, err := a.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != "0" || cf.Config.WorkingDir != "/workspace" || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != ExecutorPath ||
		cf.Config.Labels[LabelTemplate] != "py" || cf.Config.Labels[LabelHash] != strings.Repeat("ab", 32) || cf.OS != "linux" {
		t.Fatalf("config: %+v", cf.Config)
	}
}

func TestArchiveRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "minio"), []byte("MINIO"), 0o700); err != nil {
		t.Fatal(err)
	}
	img, err := Build(context.Background(), t.TempDir(), []LayerSpec{{Files: []File{{Src: filepath.Join(dir, "minio"), Dest: "/usr/bin/minio", Mode: 0o755}}}},
		Config{Entrypoint: []string{"/usr/bin/minio"}})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	tag, err := ParseTag("sbx/minio:1")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "minio.tar")
	if err := WriteArchiveFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(file, &tag)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got, err := back.Digest(); err != nil || got != want {
		t.Fatalf("digest back %s (%v), want %s", got, err, want)
	}
	if e := flatten(t, back)["usr/bin/minio"]; e.data != "MINIO" || e.hdr.Mode != 0o755 {
		t.Fatalf("usr/bin/minio: %+v %q", e.hdr, e.data)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var manifest []struct{ RepoTags []string }
	for tr := tar.NewReader(f); ; {
		h, err := tr.Next()
		if err != nil {
			t.Fatal("no manifest.json:", err)
		}
		if h.Name == "manifest.json" {
			if err := json.NewDecoder(tr).Decode(&manifest); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if len(manifest) != 1 || len(manifest[0].RepoTags) != 1 || manifest[0].RepoTags[0] != "sbx/minio:1" {
		t.Fatalf("manifest.json: %+v", manifest)
	}
}

// A directory tree as an image (e.g. a Go binary's install dir): root's
// whatever the host owner, never read through a link.
func TestDirImageGivesFilesToRoot(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pause"), []byte("PAUSE"), 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(dir, "pause"), 4242, 4242); err != nil {
			t.Fatal(err)
		}
	}
	l := writeLayer(t, LayerSpec{Tree: dir})
	e := layerEntries(t, l)["pause"]
	if e.hdr == nil || e.hdr.Uid != 0 || e.hdr.Gid != 0 || e.data != "PAUSE" {
		t.Fatalf("pause: %+v", e.hdr)
	}
}

func TestAddFileRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, src := range []string{fifo, dir} {
		_, err := WriteLayer(context.Background(), t.TempDir(), LayerSpec{Files: []File{{Src: src, Dest: "/x", Mode: 0o755}}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", src, err)
		}
	}
}

func TestParseAdd(t *testing.T) {
	good := map[string]File{
		"bin/pause:/pause":         {Src: "bin/pause", Dest: "/pause", Mode: 0o755},
		"minio:/usr/bin/minio:700": {Src: "minio", Dest: "/usr/bin/minio", Mode: 0o700},
		"a:/etc/x:0644":            {Src: "a", Dest: "/etc/x", Mode: 0o644},
	}
	for s, want := range good {
		if got, err := ParseAdd(s); err != nil || got != want {
			t.Errorf("%q: %+v %v, want %+v", s, got, err, want)
		}
	}
	for _, s := range []string{"a", ":/x", "a:x", "a:/", "a:/x:999", "a:/x:4755", "a:/x:rw", "a:/x:7:7", "a:/../x", "a:/x/.."} {
		if _, err := ParseAdd(s); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want ErrInvalidArgument", s, err)
		}
	}
}

func TestPushToARegistry(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sbx"), []byte("SBX-BINARY"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Build(context.Background(), t.TempDir(), []LayerSpec{{Tree: dir, TreeDest: "/usr/local/bin"}}, Config{Entrypoint: []string{"/usr/local/bin/sbx"}})
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	tag, err := ParseTag(host + "/sbx/sbx:dev")
	if err != nil {
		t.Fatal(err)
	}
	// Plain HTTP without the operator's word: refused, even on loopback,
	// where go-containerregistry alone would fall back to it.
	if err := Push(context.Background(), tag, img, PushOptions{}); !errors.Is(err, errPlainHTTP) {
		t.Fatalf("push over plain HTTP without Insecure: %v", err)
	}
	if err := Push(context.Background(), tag, img, PushOptions{Insecure: true}); err != nil {
		t.Fatal(err)
	}
	back, err := remote.Image(tag)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if got, _ := back.Digest(); got != want {
		t.Fatalf("pulled %s, pushed %s", got, want)
	}
	got := flatten(t, back)
	if e := got["usr/local/bin/sbx"]; e.data != "SBX-BINARY" {
		t.Fatalf("usr/local/bin/sbx: %+v %q", e.hdr, e.data)
	}
	if e := got["usr/local"]; e.hdr == nil || e.hdr.Typeflag != tar.TypeDir || e.hdr.Mode != 0o755 {
		t.Fatalf("usr/local: %+v", e.hdr)
	}
}
