//go:build integration

package server_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// The hostile suite: one tenant, with an API key and nothing else, tries
// to reach another tenant or the host. Each test is an attack that worked
// on an earlier main.

// evilPreload is a library whose constructor runs in every process that
// loads it: it records who it runs as, then tries to make the template's
// root writable and to plant a file there that every sandbox of the
// template (any tenant's) would see.
const evilPreload = `
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/mount.h>

__attribute__((constructor)) static void evil(void) {
	int rc = mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND, NULL);
	int remount_errno = rc == 0 ? 0 : errno;
	int fd = open("/etc/sbx-pwned", O_WRONLY | O_CREAT, 0644);
	int plant_errno = fd >= 0 ? 0 : errno;
	char line[128];
	snprintf(line, sizeof line, "uid=%d remount=%d plant=%d\n", (int)getuid(), remount_errno, plant_errno);
	int out = open("/workspace/evil.log", O_WRONLY | O_CREAT | O_APPEND, 0666);
	if (out >= 0) { write(out, line, strlen(line)); close(out); }
}
`

func TestHostileLDPreload(t *testing.T) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("needs gcc to build the preload library")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "evil.c")
	if err := os.WriteFile(src, []byte(evilPreload), 0o644); err != nil {
		t.Fatal(err)
	}
	so := filepath.Join(dir, "evil.so")
	runCommand(t, "gcc", exec.Command(gcc, "-shared", "-fPIC", "-O1", "-o", so, src))
	lib, err := os.ReadFile(so)
	if err != nil {
		t.Fatal(err)
	}

	keys, err := server.ParseKeys([]string{"key-mallory:mallory", "key-victim:victim"})
	if err != nil {
		t.Fatal(err)
	}
	rs := startReal(t, filepath.Join(dir, "data"), func(c *app.Config) { c.Keys = keys })
	ctx := context.Background()
	mallory := client.New(rs.URL, client.WithAPIKey("key-mallory"))
	victim := client.New(rs.URL, client.WithAPIKey("key-victim"))

	// Mallory: a session whose environment preloads her library, which she
	// uploads before the sandbox starts (sandboxes start lazily).
	testenv.New(t).Rootfs(t, "python")
	if _, _, err := mallory.CreateSession(ctx, api.CreateSessionRequest{
		SessionID: "evil", TemplateID: "python",
		EnvVars: map[string]string{"LD_PRELOAD": "/workspace/evil.so"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := mallory.Upload(ctx, "evil", client.UploadOptions{}, client.UploadFile{Name: "evil.so", Reader: bytes.NewReader(lib)}); err != nil {
		t.Fatal(err)
	}
	// A Python run starts the sandbox (executor, zygote, warm worker); a
	// bash run execs, so the library loads at least once as user code.
	for _, req := range []api.ExecuteRequest{
		{Code: "import os\nreturn os.environ.get('LD_PRELOAD')"},
		{Code: "true", Language: "bash"},
	} {
		res, err := mallory.Execute(ctx, "evil", req)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != api.ExecCompleted {
			t.Fatalf("mallory's run %q: %s %+v", req.Code, res.Status, res.Error)
		}
	}
	logRes, err := mallory.Execute(ctx, "evil", api.ExecuteRequest{Code: "return open('/workspace/evil.log').read()"})
	if err != nil {
		t.Fatal(err)
	}
	log := strings.Trim(string(logRes.ReturnValue), `"`)
	t.Logf("the library ran as: %s", log)
	if !strings.Contains(log, "uid=1000") {
		t.Errorf("the library never ran as user code (log %q): the test proves nothing", log)
	}
	if strings.Contains(log, "uid=0 ") {
		t.Errorf("the tenant's LD_PRELOAD ran as the sandbox's root: %s", log)
	}
	if strings.Contains(log, "remount=0") || strings.Contains(log, "plant=0") {
		t.Errorf("the tenant's library remounted or wrote the template root: %s", log)
	}

	// Victim: a new session of the same template sees nothing of it.
	if _, _, err := victim.CreateSession(ctx, api.CreateSessionRequest{SessionID: "innocent", TemplateID: "python"}); err != nil {
		t.Fatal(err)
	}
	res, err := victim.Execute(ctx, "innocent", api.ExecuteRequest{Code: "import os\nreturn os.path.exists('/etc/sbx-pwned')"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.ReturnValue) != "false" {
		t.Errorf("another tenant's sandbox sees /etc/sbx-pwned: %s", res.ReturnValue)
	}
}

// A tenant at its sandbox quota gets 429 for one more, and another tenant
// runs on as before.
func TestHostileSandboxQuota(t *testing.T) {
	keys, err := server.ParseKeys([]string{"key-mallory:mallory", "key-victim:victim"})
	if err != nil {
		t.Fatal(err)
	}
	limits, err := server.ParseTenantLimits([]string{"mallory:sandboxes=1"}, session.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.Keys, c.TenantLimits = keys, limits })
	ctx := context.Background()
	mallory := client.New(rs.URL, client.WithAPIKey("key-mallory"))
	victim := client.New(rs.URL, client.WithAPIKey("key-victim"))
	testenv.New(t).Rootfs(t, "python")
	for _, id := range []string{"m1", "m2"} {
		if _, _, err := mallory.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := mallory.Execute(ctx, "m1", api.ExecuteRequest{Code: "return 1"}); err != nil || res.Status != api.ExecCompleted {
		t.Fatalf("mallory's first sandbox: %+v %v", res, err)
	}
	req, _ := http.NewRequest("POST", rs.URL+"/api/v1/sessions/m2/execute?wait=true", strings.NewReader(`{"code":"return 2"}`))
	req.Header.Set("Authorization", "Bearer key-mallory")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "live sandboxes") {
		t.Errorf("mallory's second sandbox: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// The victim is not held by mallory's quota.
	for _, id := range []string{"v1", "v2"} {
		if _, _, err := victim.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: "python"}); err != nil {
			t.Fatal(err)
		}
		if res, err := victim.Execute(ctx, id, api.ExecuteRequest{Code: "return 3"}); err != nil || res.Status != api.ExecCompleted {
			t.Errorf("victim's %s: %+v %v", id, res, err)
		}
	}
	// Deleted, mallory's first sandbox no longer counts.
	if _, err := mallory.DeleteSession(ctx, "m1"); err != nil {
		t.Fatal(err)
	}
	if res, err := mallory.Execute(ctx, "m2", api.ExecuteRequest{Code: "return 2"}); err != nil || res.Status != api.ExecCompleted {
		t.Errorf("mallory's second sandbox after deleting the first: %+v %v", res, err)
	}
}
