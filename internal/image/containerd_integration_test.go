//go:build integration

package image

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// containerd starts a throwaway containerd with its own root, state and
// socket, and returns a ctr command maker for it.
func containerd(t *testing.T) func(args ...string) (string, error) {
	t.Helper()
	bin, err := exec.LookPath("containerd")
	if err != nil {
		t.Skip("containerd not installed (apt-get install containerd)")
	}
	if _, err := exec.LookPath("ctr"); err != nil {
		t.Skip("ctr not installed")
	}
	dir, err := os.MkdirTemp("", "sbxctd-") // short: the socket path is bounded
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "c.sock")
	cfg := filepath.Join(dir, "config.toml")
	// Only what an import and a mount need: no CRI, no network.
	conf := `version = 2
root = "` + filepath.Join(dir, "root") + `"
state = "` + filepath.Join(dir, "state") + `"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "` + sock + `"
[ttrpc]
  address = "` + sock + `.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
`
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "--config", cfg)
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		// Snapshots may still be mounted if a test failed midway.
		exec.Command("umount", "-R", filepath.Join(dir, "mnt")).Run()
		os.RemoveAll(dir)
	})
	ctr := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", sock, "-n", "sbxtest"}, args...)...).CombinedOutput()
		return string(out), err
	}
	// Wait for the socket: ctr version answers once containerd serves.
	for {
		if _, err := ctr("version"); err == nil {
			return ctr
		}
		select {
		case <-done:
			t.Fatalf("containerd exited: %s", log.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// containerd's importer takes the tarball, names the image by its tag
// with the image's digest, and its unpacker (overlay snapshots, as a
// node's) lays the executor over a template that tried to replace it.
func TestContainerdImportsTheArchive(t *testing.T) {
	ctr := containerd(t)
	exe := fakeExecutor(t, "REAL-EXECUTOR")
	rootfs := tree(t, map[string]string{"opt/sbx": "->/etc", "etc/sbx-executor": "EVIL", "usr/bin/python3": "ELF", "workspace": "<dir>"})
	img := templateImage(t, rootfs, exe)
	tag, err := ParseTag("sbx/py:" + strings.Repeat("ab", 32))
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "py.tar")
	if err := WriteArchiveFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	if out, err := ctr("images", "import", file); err != nil {
		t.Fatalf("ctr images import: %v: %s", err, out)
	}
	out, err := ctr("images", "ls")
	if err != nil {
		t.Fatalf("ctr images ls: %v: %s", err, out)
	}
	// containerd writes its own manifest for a docker-archive (so the
	// manifest digest is its own); the image is the same if the config
	// (the image id, what crictl and docker show) and layers are ours.
	want := "docker.io/sbx/py:" + strings.Repeat("ab", 32)
	var manifest string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == want {
			manifest = f[2]
		}
	}
	if manifest == "" {
		t.Fatalf("ctr images ls has no %s:\n%s", want, out)
	}
	m := ctrManifest(t, ctr, manifest)
	config, _ := img.ConfigName()
	if m.Config.Digest != config.String() {
		t.Errorf("containerd's image config is %s, want %s", m.Config.Digest, config)
	}
	layers, _ := img.Layers()
	if len(m.Layers) != len(layers) {
		t.Fatalf("containerd's image has %d layers, want %d", len(m.Layers), len(layers))
	}
	for i, l := range layers {
		if d, _ := l.Digest(); m.Layers[i].Digest != d.String() {
			t.Errorf("layer %d: %s, want %s", i, m.Layers[i].Digest, d)
		}
	}
	mnt := filepath.Join(filepath.Dir(file), "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := ctr("images", "mount", want, mnt); err != nil {
		t.Fatalf("ctr images mount: %v: %s", err, out)
	}
	defer ctr("images", "unmount", mnt)
	b, err := os.ReadFile(filepath.Join(mnt, "opt/sbx/sbx-executor"))
	if err != nil || string(b) != "REAL-EXECUTOR" {
		t.Fatalf("the mounted image's executor: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(mnt, "opt/sbx")); err != nil || !fi.IsDir() {
		t.Fatalf("/opt/sbx in the mounted image: %v %v, want a directory", fi, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(mnt, "usr/bin/python3"), &st); err != nil || st.Uid != 0 {
		t.Fatalf("usr/bin/python3: uid %d, %v", st.Uid, err)
	}
}

type ctrDescriptor struct {
	Digest string `json:"digest"`
}

type ctrManifestJSON struct {
	Manifests []ctrDescriptor `json:"manifests"`
	Config    ctrDescriptor   `json:"config"`
	Layers    []ctrDescriptor `json:"layers"`
}

// ctrManifest reads a manifest from containerd's content store, through
// an index if containerd made one.
func ctrManifest(t *testing.T, ctr func(...string) (string, error), digest string) ctrManifestJSON {
	t.Helper()
	for range 2 {
		out, err := ctr("content", "get", digest)
		if err != nil {
			t.Fatalf("ctr content get %s: %v: %s", digest, err, out)
		}
		var m ctrManifestJSON
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%s: %v: %s", digest, err, out)
		}
		if len(m.Manifests) == 0 {
			return m
		}
		digest = m.Manifests[0].Digest
	}
	t.Fatalf("an index of indexes at %s", digest)
	return ctrManifestJSON{}
}
