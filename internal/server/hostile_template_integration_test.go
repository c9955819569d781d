//go:build integration

package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// escapeScript is a tool of the template's own replaced by a tenant: run
// as the host's root in a chroot (as template builds once ran the
// template's own mkdir, cat and chmod to write a spec's files: writing
// /usr/bin/chmod ran the new chmod at once), its double chroot reaches the
// host's root and leaves a marker there.
const escapeScript = `#!/bin/sh
python3 - <<'EOF' 2>/dev/null
import os
try:
    os.makedirs("/sbx-jail", exist_ok=True)
    fd = os.open("/", os.O_RDONLY)
    os.chroot("/sbx-jail")
    os.fchdir(fd)
    for _ in range(64):
        os.chdir("..")
    os.chroot(".")
    open("MARKER", "w").write("escaped as uid %d\n" % os.getuid())
except Exception:
    pass
EOF
echo "hostile tool ran as uid $(id -u), $(grep CapEff /proc/self/status)"
exit 0
`

// TestHostileTemplateBuild (issue 21): a tenant's template whose files
// replace the tools a build used to run builds, and nothing it holds runs
// outside a sandbox: the marker its tools would leave on the host never
// appears, neither during the build nor when sessions on runc and runsc
// run those tools.
func TestHostileTemplateBuild(t *testing.T) {
	testenv.New(t).Rootfs(t, "python")
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	marker := filepath.Join(t.TempDir(), "escaped")
	script := strings.ReplaceAll(escapeScript, "MARKER", marker)
	b := make([]byte, 6)
	rand.Read(b)
	nonce := hex.EncodeToString(b)
	name := "hostile-" + nonce
	spec := map[string]any{"name": name, "files": map[string]string{
		"/usr/bin/chmod":  script,
		"/usr/bin/mkdir":  script,
		"/etc/sbx-nonce":  nonce,
		"/usr/local/x/y/": "",
	}}
	// A path that ends in a slash is no file: refused before any build.
	if _, _, err := c.CreateTemplate(ctx, spec); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a spec with a directory path: %v", err)
	}
	delete(spec["files"].(map[string]string), "/usr/local/x/y/")
	tm, _, err := c.CreateTemplate(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	end, err := c.FollowTemplateBuild(ctx, name, tm.Build.BuildID, func(line string) { log.WriteString(line) })
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Fatalf("the template's tools ran on the host during its build: %s\nbuild log:\n%s", b, log.String())
	}
	if end.Status != api.TemplateReady {
		t.Fatalf("build ended %s: %s\n%s", end.Status, end.LastError, log.String())
	}
	if strings.Contains(log.String(), "hostile tool ran") {
		t.Errorf("the template's tools ran during its build:\n%s", log.String())
	}

	runtimes := []string{"runc"}
	if _, err := exec.LookPath("runsc"); err == nil {
		runtimes = append(runtimes, "runsc")
	}
	for _, rtName := range runtimes {
		t.Run(rtName, func(t *testing.T) {
			tname := name
			if rtName != "runc" {
				tname = name + "-" + rtName
				s := map[string]any{"name": tname, "runtime": rtName, "files": spec["files"]}
				tm, _, err := c.CreateTemplate(ctx, s)
				if err != nil {
					t.Fatal(err)
				}
				if end, err := c.FollowTemplateBuild(ctx, tname, tm.Build.BuildID, nil); err != nil || end.Status != api.TemplateReady {
					t.Fatalf("%s: %+v, %v", tname, end, err)
				}
			}
			sid := "hostile-" + rtName
			if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, TemplateID: tname}); err != nil {
				t.Fatal(err)
			}
			res := execOK(t, c, sid, api.ExecuteRequest{Language: "bash", Code: "head -1 /etc/sbx-nonce; echo; chmod 0 /tmp/x; mkdir /tmp/y"})
			if !strings.Contains(res.Stdout, nonce) || !strings.Contains(res.Stdout, "hostile tool ran as uid 1000, CapEff:\t0000000000000000") {
				t.Errorf("in the sandbox: %q", res.Stdout)
			}
			if b, err := os.ReadFile(marker); err == nil {
				t.Fatalf("the template's tools reached the host from a %s sandbox: %s", rtName, b)
			}
		})
	}
}

// TestTenantTemplateNeverBuildsInline (issue 21): a session on a tenant's
// template that is not built yet is refused with the build's id (503 while
// it builds, 409 once it failed); it never builds the template itself,
// outside the build queue and its limits.
func TestTenantTemplateNeverBuildsInline(t *testing.T) {
	testenv.New(t).Rootfs(t, "python")
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	b := make([]byte, 6)
	rand.Read(b)
	name := "inline-" + hex.EncodeToString(b)
	files := map[string]string{"/etc/sbx-inline": name}
	// Hold the build's lock as another process would: the build waits.
	want := template.Spec{Name: name, Files: files, Owner: "default"}
	lockPath := filepath.Join(testenv.TemplateDir(), "locks", want.Hash()+".lock")
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	tm, _, err := c.CreateTemplate(ctx, map[string]any{"name": name, "files": files})
	if err != nil {
		t.Fatal(err)
	}
	if tm.Hash != want.Hash() {
		t.Fatalf("the build's hash is %s, the test locked %s", tm.Hash, want.Hash())
	}
	id := tm.Build.BuildID
	if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: "early", TemplateID: name, WarmUp: true}); err != nil {
		t.Fatal(err)
	}
	// Once, without the client's retries. Before this was refused, the
	// execution built the template itself and waited here for the build's
	// lock: the timeout only catches that.
	execute := func() (int, string) {
		t.Helper()
		early, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(early, http.MethodPost, rs.URL+api.Prefix+"/sessions/early/execute?wait=true", strings.NewReader(`{"code":"print(1)"}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := execute(); code != http.StatusServiceUnavailable || !strings.Contains(body, id) || !strings.Contains(body, "building") {
		t.Fatalf("a session on a template still building: %d %s; want 503 naming build %s", code, body, id)
	}
	if _, err := os.Stat(filepath.Join(testenv.TemplateDir(), "builds", want.Hash())); !os.IsNotExist(err) {
		t.Fatalf("the template was built while its build waited for its lock (%v)", err)
	}
	if _, err := c.CancelTemplateBuild(ctx, name, id); err != nil {
		t.Fatal(err)
	}
	if end, err := c.FollowTemplateBuild(ctx, name, id, nil); err != nil || end.Status != api.TemplateCancelled {
		t.Fatalf("the cancelled build: %+v, %v", end, err)
	}
	code, body := execute()
	if code != http.StatusConflict || !strings.Contains(body, id) || !strings.Contains(body, "cancelled") {
		t.Fatalf("a session on a template whose build was cancelled: %d %s; want 409 naming build %s", code, body, id)
	}
	t.Logf("refused as expected: %s", body)
}
