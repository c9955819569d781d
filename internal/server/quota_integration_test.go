//go:build integration

package server_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// The workspace disk quota as code in a sandbox meets it: every
// way of filling a disk stops at resources.disk with EDQUOT, and the
// host's disk grows by no more than that and btrfs's metadata.
const quotaMB = 16

// fillers are bash (or Python) programs that try to put far more than
// quotaMB into the workspace; each prints "stopped: ..." with the error
// that stopped it.
var fillers = []struct {
	name, lang, code string
}{
	{"big file", "bash", `dd if=/dev/zero of=/workspace/big bs=1M count=200 2>&1 | grep -o 'dd: error writing.*' | sed 's/^/stopped: /'`},
	// One file of 99 MiB each passed RLIMIT_FSIZE (100 MiB) on main: 20
	// of them put 2 GB on the host. Files under the 16 MiB rlimit here.
	{"many files", "bash", `for i in $(seq 1 40); do head -c 1048576 /dev/zero > /workspace/f$i 2>/tmp/err || { echo "stopped: $(cat /tmp/err)"; break; }; done`},
	{"fallocate", "bash", `for i in $(seq 0 40); do fallocate -o $((i*4))M -l 4M /workspace/fa 2>/tmp/err || { echo "stopped: $(cat /tmp/err)"; break; }; done`},
	{"fallocate keep size", "bash", `touch /workspace/fk; for i in $(seq 0 40); do fallocate -n -o $((i*4))M -l 4M /workspace/fk 2>/tmp/err || { echo "stopped: $(cat /tmp/err)"; break; }; done; stat -c 'size %s' /workspace/fk`},
	// Sparse files cost nothing until written; RLIMIT_FSIZE keeps each
	// under resources.disk, so four of them, filled in.
	{"sparse then writes", "bash", `for f in 1 2 3 4; do truncate -s 15M /workspace/sparse$f; done
for f in 1 2 3 4; do for i in $(seq 0 14); do dd if=/dev/zero of=/workspace/sparse$f bs=1M count=1 seek=$i conv=notrunc status=none 2>/tmp/err || { echo "stopped: $(cat /tmp/err)"; break 2; }; done; done`},
	// About 45,000 empty files fill 16 MiB of metadata; 300,000 is far
	// past it and stays affordable.
	{"inode flood", "python", `import os
n = 0
try:
    while n < 300000:
        if n % 1000 == 0:
            os.mkdir('/workspace/d%d' % (n // 1000))
        open('/workspace/d%d/%d' % (n // 1000, n), 'w').close()
        n += 1
except OSError as e:
    print('stopped:', os.strerror(e.errno), 'after', n, 'files')`},
}

func startQuotaServer(t *testing.T, configure ...func(*app.Config)) *realServer {
	testenv.New(t).Rootfs(t, "python")
	return startReal(t, t.TempDir(), configure...)
}

func TestWorkspaceQuotaHolds(t *testing.T) {
	rs := startQuotaServer(t)
	c := client.New(rs.URL)
	for i, f := range fillers {
		t.Run(f.name, func(t *testing.T) {
			sid := fmt.Sprint("fill-", i)
			newSession(t, c, api.CreateSessionRequest{SessionID: sid, TemplateID: "python", Resources: &api.Resources{Disk: quotaMB}})
			before := imageBytes(t, rs.dir)
			res, err := c.Execute(context.Background(), sid, api.ExecuteRequest{Language: f.lang, Code: f.code, Timeout: 300})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("stdout %q stderr %q", res.Stdout, res.Stderr)
			if !strings.Contains(res.Stdout, "stopped: ") || !quotaMessage(res.Stdout) {
				t.Fatalf("the filler was not stopped by the quota: stdout %q, stderr %q", res.Stdout, res.Stderr)
			}
			if used := diskUsage(t, filepath.Join(rs.dir, "workspaces", "default", sid)); used > quotaMB<<20+1<<20 {
				t.Errorf("the workspace holds %d bytes, quota %d MiB", used, quotaMB)
			}
			// Metadata beyond the workspace's own tree: see the quota
			// package's slack.
			grew := imageBytes(t, rs.dir) - before
			t.Logf("the host's disk grew by %.1f MiB", float64(grew)/(1<<20))
			if grew > quotaMB<<20+8<<20 {
				t.Errorf("the host's disk grew by %d bytes for a quota of %d MiB", grew, quotaMB)
			}
			// A full workspace can be cleaned up from inside.
			execOK(t, c, sid, api.ExecuteRequest{Language: "bash", Code: "rm -rf /workspace/* && head -c 4M /dev/zero > /workspace/after"})
		})
	}
	// btrfs lets anyone make a subvolume, which would be outside the
	// workspace's quota: the sandbox's seccomp filter refuses it.
	t.Run("subvolume", func(t *testing.T) {
		newSession(t, c, api.CreateSessionRequest{SessionID: "subvol", TemplateID: "python", Resources: &api.Resources{Disk: quotaMB}})
		res := execOK(t, c, "subvol", api.ExecuteRequest{Code: `import fcntl, os
fd = os.open('/workspace', os.O_RDONLY)
arg = bytearray(4096)
arg[8:14] = b'nested'
try:
    fcntl.ioctl(fd, 0x5000940e, arg)
    return 'made'
except OSError as e:
    return os.strerror(e.errno)`})
		if string(res.ReturnValue) != `"Operation not permitted"` {
			t.Errorf("making a subvolume in the workspace: %s", res.ReturnValue)
		}
	})
}

// A warm-pool claim moves the session's files into the pooled sandbox's
// workspace, whose quota must then be the session's.
func TestWorkspaceQuotaAfterPoolClaim(t *testing.T) {
	rs := startQuotaServer(t, func(c *app.Config) { c.Pools = map[string]int{"python": 1} })
	c := client.New(rs.URL)
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for rs.app.Sessions.PoolSizes()["python"] < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the pool was not filled")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "claim", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upload(ctx, "claim", client.UploadOptions{}, client.UploadFile{Name: "data.csv", Reader: strings.NewReader("a,b\n1,2\n")}); err != nil {
		t.Fatal(err)
	}
	// The template's default disk (1 GiB): fallocate fills it without
	// writing the bytes.
	res := execOK(t, c, "claim", api.ExecuteRequest{Language: "bash", Code: `cat /workspace/data.csv
for i in $(seq 0 40); do fallocate -o $((i*64))M -l 64M /workspace/fa 2>/tmp/err || { echo "stopped at $i: $(cat /tmp/err)"; break; }; done`})
	t.Logf("stdout %q", res.Stdout)
	if !strings.HasPrefix(res.Stdout, "a,b\n1,2\n") {
		t.Errorf("the session's upload is not in its pooled sandbox: %q", res.Stdout)
	}
	if !strings.Contains(res.Stdout, "stopped at") || !quotaMessage(res.Stdout) {
		t.Fatalf("the quota did not hold after a claim: %q", res.Stdout)
	}
	if s, _ := c.GetSession(ctx, "claim"); rs.sandboxesOf(t, "claim") != 0 || s.SandboxState != api.SandboxRunning {
		t.Errorf("the session did not run in the pooled sandbox")
	}
	if used := diskUsage(t, filepath.Join(rs.dir, "workspaces", "default", "claim")); used > 1024<<20+1<<20 {
		t.Errorf("the workspace holds %d bytes, quota 1 GiB", used)
	}
}

// A full workspace hibernates and comes back whole, and still full.
func TestWorkspaceQuotaHibernateFull(t *testing.T) {
	rs := startQuotaServer(t)
	c := client.New(rs.URL)
	ctx := context.Background()
	newSession(t, c, api.CreateSessionRequest{SessionID: "full", TemplateID: "python", Resources: &api.Resources{Disk: quotaMB}})
	res := execOK(t, c, "full", api.ExecuteRequest{Language: "bash", Code: `for i in $(seq 1 40); do head -c 1048576 /dev/urandom > /workspace/f$i 2>/dev/null || break; done; sync; cat /workspace/f* | sha256sum`})
	sum := res.Stdout
	if _, err := c.HibernateSession(ctx, "full"); err != nil {
		t.Fatal(err)
	}
	res = execOK(t, c, "full", api.ExecuteRequest{Language: "bash", Code: `cat /workspace/f* | sha256sum; head -c 8M /dev/zero > /workspace/more 2>&1 || true`})
	if !strings.HasPrefix(res.Stdout, sum) {
		t.Errorf("restored content %q, want %q", res.Stdout, sum)
	}
	if !quotaMessage(res.Stdout + res.Stderr) {
		t.Errorf("the restored workspace took 8 MiB more: %q %q", res.Stdout, res.Stderr)
	}
}

func quotaMessage(s string) bool {
	return strings.Contains(s, "Disk quota exceeded") || strings.Contains(s, "No space left on device")
}

// diskUsage is the space the files under dir take (not their sizes).
func diskUsage(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		n += info.Sys().(*syscall.Stat_t).Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// imageBytes is the host disk the workspace image of the data directory
// dir uses, once btrfs has given back (FITRIM) what it freed.
func imageBytes(t *testing.T, dir string) int64 {
	t.Helper()
	unix.Sync()
	f, err := os.Open(filepath.Join(dir, "workspaces"))
	if err != nil {
		t.Fatal(err)
	}
	r := struct{ start, len, minlen uint64 }{0, ^uint64(0), 0}
	const fitrim = 0xc0185879 // _IOWR('X', 121, struct fstrim_range)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fitrim, uintptr(unsafe.Pointer(&r)))
	f.Close()
	if errno != 0 {
		t.Fatalf("FITRIM: %v", errno)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "workspaces.img"), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}
