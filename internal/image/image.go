package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// ExecutorPath is where a template image holds the executor: the mount
// point every template has (internal/template/build.go), where the oci
// runtime bind-mounts it.
const ExecutorPath = "/opt/sbx/sbx-executor"

// Labels a template image carries.
const (
	LabelTemplate = "io.sbx.template"
	LabelHash     = "io.sbx.template.hash"
)

// templateEnv is a template image's environment: what the executor and
// the zygote expect (as internal/runtime/oci's baseEnv; the runtime that
// starts the Pod sets the rest).
var templateEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/tmp",
	"LANG=C.UTF-8",
}

// Config is an image's run configuration.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	User       string
	WorkingDir string
	Labels     map[string]string
}

// Image is an image whose layers are files in a temporary directory;
// Close removes them.
type Image struct {
	v1.Image
	dir string
}

// Close removes the image's layer files.
func (i *Image) Close() error { return os.RemoveAll(i.dir) }

// Build writes the layers (bottom first) and makes the image. Created is
// the epoch and History empty, so that the same layers and config give
// the same digest on any host at any time.
func Build(ctx context.Context, tmp string, layers []LayerSpec, cfg Config) (*Image, error) {
	dir, err := os.MkdirTemp(tmp, "sbx-image-")
	if err != nil {
		return nil, err
	}
	img, err := build(ctx, dir, layers, cfg)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Image{Image: img, dir: dir}, nil
}

func build(ctx context.Context, dir string, specs []LayerSpec, cfg Config) (v1.Image, error) {
	if len(specs) == 0 {
		return nil, fmt.Errorf("an image of no layers: %w", errdefs.ErrInvalidArgument)
	}
	var adds []mutate.Addendum
	for _, s := range specs {
		l, err := WriteLayer(ctx, dir, s)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: l})
	}
	img, err := mutate.Append(empty.Image, adds...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = goruntime.GOARCH, "linux"
	cf.Created = v1.Time{Time: time.Unix(0, 0).UTC()}
	cf.History = nil
	cf.Config = v1.Config{
		Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Env: cfg.Env,
		User: cfg.User, WorkingDir: cfg.WorkingDir, Labels: cfg.Labels,
	}
	return mutate.ConfigFile(img, cf)
}

// Template makes a template build's image: its rootfs as one layer, owned
// by the sandbox's own ids, and the executor (the static binary at
// executor) as a layer of its own on top. On top, because in an image the
// upper layer wins: a template whose /opt or /opt/sbx is a link, a file,
// or holds its own sbx-executor, or whose tree is named to look like a
// whiteout, cannot replace or hide the executor (a layer's whiteouts
// reach only the layers below it, and an upper directory replaces a lower
// non-directory). Its own layer, so that every template built with one
// executor shares that layer's digest: a node pulls it once.
func Template(ctx context.Context, tmp string, store *template.Store, t *template.Template, executor string) (*Image, error) {
	shift := store.UIDShift
	if shift == 0 {
		shift = template.DefaultUIDShift
	}
	return Build(ctx, tmp, []LayerSpec{
		{Tree: t.Rootfs, IDs: ShiftIDs(shift)},
		{Files: []File{{Src: executor, Dest: ExecutorPath, Mode: 0o755}}},
	}, Config{
		Entrypoint: []string{ExecutorPath},
		Env:        templateEnv,
		User:       "0",
		WorkingDir: "/workspace",
		Labels:     map[string]string{LabelTemplate: t.Spec.Name, LabelHash: t.Hash},
	})
}

// ParseAdd parses --add SRC:DST[:MODE] (MODE octal, default 0755 for a
// file).
func ParseAdd(s string) (File, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") {
		return File{}, fmt.Errorf("--add %q: want SRC:/DST[:MODE]: %w", s, errdefs.ErrInvalidArgument)
	}
	f := File{Src: parts[0], Dest: parts[1], Mode: 0o755}
	if _, err := cleanDest(f.Dest); err != nil {
		return File{}, err
	}
	if len(parts) == 3 {
		m, err := strconv.ParseUint(parts[2], 8, 32)
		if err != nil || m > 0o777 {
			return File{}, fmt.Errorf("--add %q: mode %q: want octal permission bits: %w", s, parts[2], errdefs.ErrInvalidArgument)
		}
		f.Mode = os.FileMode(m)
	}
	return f, nil
}

// ParseTag parses an image reference with a tag (docker.io's rules for a
// missing registry, as containerd and Kubernetes apply them).
func ParseTag(ref string) (name.Tag, error) {
	if len(ref) > 512 {
		return name.Tag{}, fmt.Errorf("image reference of %d bytes: %w", len(ref), errdefs.ErrInvalidArgument)
	}
	t, err := name.NewTag(ref)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image reference %q (want REPOSITORY:TAG): %v: %w", ref, err, errdefs.ErrInvalidArgument)
	}
	return t, nil
}

// WriteArchive writes img as a docker-archive tarball tagged tag: what
// `docker load` and `ctr images import` take.
func WriteArchive(w io.Writer, tag name.Tag, img v1.Image) error {
	return tarball.Write(tag, img, w)
}

// WriteArchiveFile writes the tarball to file, atomically: a reader never
// sees half an archive.
func WriteArchiveFile(file string, tag name.Tag, img v1.Image) error {
	f, err := os.CreateTemp(filepath.Dir(file), ".image-*.tar")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := WriteArchive(f, tag, img); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), file)
}

// PushOptions say how to reach a registry.
type PushOptions struct {
	// Insecure allows plain HTTP. Without it every request is HTTPS:
	// go-containerregistry on its own falls back to HTTP for loopback and
	// private addresses, which would let anyone on the path downgrade a
	// push; here the fallback needs the operator's word.
	Insecure bool
	// Transport is the base transport (remote.DefaultTransport if nil).
	Transport http.RoundTripper
}

// Push pushes img to the registry as tag. Credentials are the docker
// config's (~/.docker/config.json, DOCKER_CONFIG), as every registry
// client reads them.
func Push(ctx context.Context, tag name.Tag, img v1.Image, opts PushOptions) error {
	if opts.Insecure {
		t, err := name.NewTag(tag.String(), name.Insecure)
		if err != nil {
			return err
		}
		tag = t
	}
	base := opts.Transport
	if base == nil {
		base = remote.DefaultTransport
	}
	rt := base
	if !opts.Insecure {
		rt = httpsOnly{base}
	}
	if err := remote.Write(tag, img, remote.WithContext(ctx), remote.WithTransport(rt), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) || errors.Is(err, errPlainHTTP) {
			return fmt.Errorf("push %s: %w: %w", tag, err, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("push %s: %w", tag, err)
	}
	return nil
}

var errPlainHTTP = errors.New("plain HTTP to a registry needs --insecure")

// httpsOnly refuses any request that is not HTTPS.
type httpsOnly struct{ http.RoundTripper }

func (h httpsOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" {
		return nil, fmt.Errorf("%s: %w", r.URL.Redacted(), errPlainHTTP)
	}
	return h.RoundTripper.RoundTrip(r)
}

// ExecutorSuffix is what a template image's tag carries after the build
// hash for the executor inside it (ExecutorPath): "-x" and the start of
// the executor's SHA-256. A template build is one tree, but its image is
// the tree and an executor; a new sbx (a new executor) so makes new tags,
// which nodes pull afresh, while the Pods of running sessions keep the
// image they started with. kube.Config.ImageSuffix takes it.
func ExecutorSuffix(executor string) (string, error) {
	f, err := os.Open(executor)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "-x" + hex.EncodeToString(h.Sum(nil))[:16], nil
}
