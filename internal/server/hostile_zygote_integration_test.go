//go:build integration

package server_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// tenantRecord is Python that appends who runs it (uid, capability sets,
// no_new_privs) to a log in /tmp, which the sandbox's processes share.
const tenantRecord = `
def _sbx_record(tag, path='/tmp/sbx-tenant.log'):
    import os
    keep = ('Uid', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs')
    with open('/proc/self/status') as f:
        lines = [l.strip().replace('\t', ' ') for l in f if l.split(':')[0] in keep]
    with open(path, 'a') as f:
        f.write('%s pid=%d | %s\n' % (tag, os.getpid(), ' | '.join(lines)))
`

// tenantPreload is a preload module that records itself and then, in
// children so that the zygote stays as it is, attacks what a privileged
// zygote could reach.
const tenantPreload = tenantRecord + `
_sbx_record('preload')

def _sbx_attacks():
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    res = {}
    def rc(name, r):
        res[name] = 'ok' if r == 0 else os.strerror(ctypes.get_errno())
    # The control directory: its socket, and room on the host's /run.
    res['socket_visible'] = os.path.exists('/run/sbx/executor.sock')
    for name, f in (('write_run_sbx', lambda: open('/run/sbx/sbx-evil', 'w').close()),
                    ('link_socket', lambda: os.link('/run/sbx/executor.sock', '/run/sbx/evil.sock')),
                    ('replace_socket', lambda: os.rename('/run/sbx/zygote.py', '/run/sbx/executor.sock'))):
        try:
            f()
            res[name] = 'ok'
        except OSError as e:
            res[name] = e.strerror
    # As the sandbox user (a privileged zygote could become it): a btrfs
    # subvolume in the workspace, outside its quota; namespaces.
    if os.getuid() == 0:
        os.setresgid(1000, 1000, 1000)
        os.setresuid(1000, 1000, 1000)
    args = ctypes.create_string_buffer(4096)  # struct btrfs_ioctl_vol_args
    ctypes.memmove(ctypes.addressof(args) + 8, b'sbx-evil-subvol', 15)
    fd = os.open('/workspace', os.O_RDONLY | os.O_DIRECTORY)
    rc('btrfs_subvol_create', libc.ioctl(fd, ctypes.c_ulong(0x5000940e), args))
    os.close(fd)
    rc('unshare_net', libc.unshare(0x40000000))
    rc('unshare_user', libc.unshare(0x10000000))
    with open('/tmp/sbx-tenant-attacks.json', 'w') as f:
        json.dump(res, f)

import os as _os
# Megabytes to stderr, which is the executor's log.
for _ in range(64):
    _os.write(2, b'x' * (128 << 10))
_pid = _os.fork()
if _pid == 0:
    try:
        _sbx_attacks()
    finally:
        _os._exit(0)
_os.waitpid(_pid, 0)
`

// tenantLibrary is a library /etc/ld.so.preload names: every dynamically
// linked process loads it, the zygote's interpreter first.
const tenantLibrary = `
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

__attribute__((constructor)) static void record(void) {
	char buf[8192], out[2048] = "ld.so.preload |";
	int fd = open("/proc/self/status", O_RDONLY);
	if (fd < 0) return;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0) return;
	buf[n] = 0;
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
		if (!strncmp(line, "Uid:", 4) || !strncmp(line, "Cap", 3) || !strncmp(line, "NoNewPrivs:", 11)) {
			for (char *p = line; *p; p++) if (*p == '\t') *p = ' ';
			strncat(out, " ", sizeof out - strlen(out) - 1);
			strncat(out, line, sizeof out - strlen(out) - 1);
			strncat(out, " |", sizeof out - strlen(out) - 1);
		}
	}
	strncat(out, "\n", sizeof out - strlen(out) - 1);
	int log = open("/tmp/sbx-tenant.log", O_WRONLY | O_CREAT | O_APPEND, 0666);
	if (log >= 0) { write(log, out, strlen(out)); close(log); }
}
`

// TestHostileTemplateRunsUnprivileged: a tenant's template may put its
// own code where the zygote runs it before any of sbx's: a sitecustomize,
// a preload module, a library in /etc/ld.so.preload, its own
// /usr/bin/python3. None of it runs with a capability, on runc or runsc,
// and from the zygote it can neither make a btrfs subvolume nor a user or
// network namespace, nor touch the control directory.
func TestHostileTemplateRunsUnprivileged(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build the ld.so.preload library")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "tenant.c")
	if err := os.WriteFile(src, []byte(tenantLibrary), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "tenant.so")
	runCommand(t, "gcc", exec.Command(gcc, "-shared", "-fPIC", "-O1", "-o", so, src))
	lib, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}
	testenv.New(t).Rootfs(t, "python") // the base layer, built once per machine
	rs := startReal(t, filepath.Join(dir, "data"))
	c := client.New(rs.URL)
	ctx := context.Background()
	b := make([]byte, 6)
	rand.Read(b)
	nonce := hex.EncodeToString(b)

	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			if _, err := exec.LookPath(rt); err != nil {
				t.Skipf("%s is not installed", rt)
			}
			name := "tenant-" + rt + "-" + nonce
			buildTemplate(t, c, map[string]any{
				"name": name, "runtime": rt, "preload": []string{"sbxtenant"},
				"files": map[string]string{
					// Debian's python3.11 reads this one (a symlink to
					// /etc/python3.11/sitecustomize.py), -I or not.
					"/etc/python3.11/sitecustomize.py":            tenantRecord + "_sbx_record('sitecustomize')\n",
					"/usr/lib/python3/dist-packages/sbxtenant.py": tenantPreload,
					"/etc/ld.so.preload":                          "/workspace/tenant.so\n",
				},
			})
			sid := "s-" + rt
			if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, TemplateID: name}); err != nil {
				t.Fatal(err)
			}
			// Uploaded before the sandbox starts (sandboxes start lazily).
			if _, err := c.Upload(ctx, sid, client.UploadOptions{}, client.UploadFile{Name: "tenant.so", Reader: bytes.NewReader(lib)}); err != nil {
				t.Fatal(err)
			}
			res := execOK(t, c, sid, api.ExecuteRequest{Code: "return [open('/tmp/sbx-tenant.log').read(), open('/tmp/sbx-tenant-attacks.json').read()]"})
			var out []string
			if err := json.Unmarshal(res.ReturnValue, &out); err != nil || len(out) != 2 {
				t.Fatalf("return value %s: %v", res.ReturnValue, err)
			}
			t.Logf("what the tenant's code ran as:\n%s", out[0])
			checkUnprivileged(t, out[0], "sitecustomize", "preload", "ld.so.preload")
			var attacks map[string]any
			if err := json.Unmarshal([]byte(out[1]), &attacks); err != nil {
				t.Fatalf("attacks %q: %v", out[1], err)
			}
			t.Logf("from the zygote: %v", attacks)
			want := map[string]any{
				"socket_visible": false, "btrfs_subvol_create": "Operation not permitted",
				"unshare_net": "Operation not permitted", "unshare_user": "Operation not permitted",
			}
			if rt == "runsc" {
				// gVisor cannot setns into a user namespace, so there the
				// zygote makes its own after its preload, and its filter
				// lets unshare make one (internal/executor/shim.go): a
				// namespace of the sentry's, with no capability over the
				// sandbox's. User code still cannot (the inner filter).
				delete(want, "unshare_user")
			}
			for k, w := range want {
				if attacks[k] != w {
					t.Errorf("from the zygote, %s: %v, want %v", k, attacks[k], w)
				}
			}
			for _, k := range []string{"write_run_sbx", "link_socket", "replace_socket"} {
				if attacks[k] == "ok" {
					t.Errorf("from the zygote, %s succeeded", k)
				}
			}
			// The sandbox still serves.
			execOK(t, c, sid, api.ExecuteRequest{Code: "print(1)"})
			// The 8 MiB the preload wrote to stderr went to the executor's
			// rotating log in the control directory's tmpfs, not to the
			// file of runc's output on the host.
			bundles, _ := filepath.Glob(filepath.Join(testenv.New(t).StateRoot, "srv", "sandboxes", "*"))
			for _, b := range bundles {
				runcLog, kept := fileSize(filepath.Join(b, "executor.log")), fileSize(filepath.Join(b, "ctl", "executor.log"))+fileSize(filepath.Join(b, "ctl", "executor.log.1"))
				t.Logf("%s: runc's log %d bytes, the executor's %d", filepath.Base(b), runcLog, kept)
				if runcLog > 64<<10 || kept > 1<<20 {
					t.Errorf("sandbox %s: runc's log holds %d bytes, the executor's %d", filepath.Base(b), runcLog, kept)
				}
			}
		})
	}

	// A template whose /usr/bin/python3 is the tenant's script. (Written
	// through Debian's symlink, it replaces the interpreter itself: the
	// sandbox has no Python left, so the script reports on stderr, which
	// is the executor's log, and the runs fail.)
	for _, rt := range []string{"runc", "runsc"} {
		t.Run("python3-"+rt, func(t *testing.T) {
			if _, err := exec.LookPath(rt); err != nil {
				t.Skipf("%s is not installed", rt)
			}
			marker := "sbx-wrapper-" + rt + "-" + nonce
			name := "wrapper-" + rt + "-" + nonce
			buildTemplate(t, c, map[string]any{
				"name": name, "runtime": rt,
				"files": map[string]string{"/usr/bin/python3": "#!/bin/sh\n" +
					"# /proc/self as the shell opens it: $$ would be a pid of another namespace.\n" +
					"s=''; while read -r k v; do case $k in Uid:|Cap*|NoNewPrivs:) s=\"$s | $k $v\";; esac; done < /proc/self/status\n" +
					"echo \"" + marker + "$s\" >&2\nexit 1\n"},
			})
			sid := "w-" + rt
			if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, TemplateID: name}); err != nil {
				t.Fatal(err)
			}
			// The first run starts the sandbox; it fails (there is no
			// Python), and the executor retries the zygote meanwhile.
			if _, err := c.Submit(ctx, sid, api.ExecuteRequest{Code: "print(1)"}); err != nil {
				t.Fatal(err)
			}
			var lines []string
			root := filepath.Join(testenv.New(t).StateRoot, "srv", "sandboxes")
			for deadline := time.Now().Add(time.Minute); len(lines) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				logs, _ := filepath.Glob(filepath.Join(root, "*", "*executor.log*"))
				more, _ := filepath.Glob(filepath.Join(root, "*", "ctl", "*executor.log*"))
				for _, l := range append(logs, more...) {
					data, _ := os.ReadFile(l)
					for _, line := range strings.Split(string(data), "\n") {
						if strings.HasPrefix(line, marker) {
							lines = append(lines, "python3 "+line)
						}
					}
				}
			}
			t.Logf("what the tenant's python3 ran as:\n%s", strings.Join(lines, "\n"))
			checkUnprivileged(t, strings.Join(lines, "\n"), "python3")
		})
	}
}

func fileSize(p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// buildTemplate defines a template over the API and waits for its build.
func buildTemplate(t *testing.T, c *client.Client, spec map[string]any) {
	t.Helper()
	ctx := context.Background()
	tm, _, err := c.CreateTemplate(ctx, spec)
	if err != nil || tm.Build == nil {
		t.Fatalf("CreateTemplate(%v) = %+v, %v", spec["name"], tm, err)
	}
	var log strings.Builder
	end, err := c.FollowTemplateBuild(ctx, spec["name"].(string), tm.Build.BuildID, func(line string) { log.WriteString(line) })
	if err != nil {
		t.Fatal(err)
	}
	if end.Status != api.TemplateReady {
		t.Fatalf("build of %s ended %+v\n%s", spec["name"], end, log.String())
	}
}

// checkUnprivileged checks the records in log (one line each: a tag, then
// "| Field: values" items from /proc/self/status): every capability set
// empty, uid 1000, no_new_privs where the kernel shows it; and that each
// of tags wrote one at least.
func checkUnprivileged(t *testing.T, log string, tags ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if line == "" {
			continue
		}
		items := strings.Split(line, "|")
		tag := strings.Fields(items[0])
		if len(tag) == 0 {
			continue
		}
		fields := 0
		for _, item := range items[1:] {
			key, val, ok := strings.Cut(strings.TrimSpace(item), ":")
			if !ok {
				continue
			}
			f := strings.Fields(val)
			switch {
			case strings.HasPrefix(key, "Cap") && (len(f) != 1 || strings.Trim(f[0], "0") != ""):
				t.Errorf("%s ran with %s %s: %s", tag[0], key, val, line)
			case key == "Uid" && (len(f) == 0 || f[0] != "1000"):
				t.Errorf("%s ran as uid %s: %s", tag[0], val, line)
			case key == "NoNewPrivs" && strings.TrimSpace(val) != "1":
				t.Errorf("%s ran without no_new_privs: %s", tag[0], line)
			}
			if key == "Uid" || key == "CapEff" {
				fields++
			}
		}
		if fields == 2 {
			seen[tag[0]] = true
		}
	}
	for _, tag := range tags {
		if !seen[tag] {
			t.Errorf("no record of %s: the test proves nothing (log %q)", tag, log)
		}
	}
}
