//go:build integration

package server_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// The data directory is the server's alone: a local user who knows where a
// workspace file is cannot read it, nor list the data directory, while
// sandboxes, on runc and on runsc, still start and work on their
// workspaces (which they reach through bind mounts under the state
// directory, never through the data directory).
func TestDataDirPrivate(t *testing.T) {
	for _, rtName := range []string{"runc", "runsc"} {
		t.Run(rtName, func(t *testing.T) {
			env := testenv.New(t)
			// The data directory's parent lets everyone through, as
			// /var/lib does: only the data directory's own modes keep
			// other users out.
			parent, err := os.MkdirTemp("", "sbx-datadir-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(parent) })
			if err := os.Chmod(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			data := filepath.Join(parent, "data")
			state := filepath.Join(env.StateRoot, "dd-"+rtName)
			rs := startReal(t, data, func(c *app.Config) {
				c.StateDir = state
				c.Runtime = func(string) (runtime.Runtime, error) {
					return oci.New(realRuntime(t, rtName, state, data))
				}
			})
			c := client.New(rs.URL)
			ctx := context.Background()
			newSession(t, c, api.CreateSessionRequest{SessionID: "private", TemplateID: "python"})
			t.Cleanup(func() { c.DeleteSession(ctx, "private") }) // its sandbox, which startReal's cleanup (runc) does not know
			res := execOK(t, c, "private", api.ExecuteRequest{Language: "bash", Code: "echo secret > /workspace/secret.txt && cat /workspace/secret.txt && id -u"})
			// runsc's kernel is gVisor's own, not the host's.
			host, err := exec.Command("uname", "-r").Output()
			if err != nil {
				t.Fatal(err)
			}
			kernel := execOK(t, c, "private", api.ExecuteRequest{Language: "bash", Code: "uname -r"}).Stdout
			if (kernel == string(host)) != (rtName == "runc") {
				t.Fatalf("the sandbox's kernel %q, the host's %q: not a %s sandbox", kernel, host, rtName)
			}
			if got := strings.Fields(res.Stdout); len(got) != 2 || got[0] != "secret" || got[1] != "1000" {
				t.Fatalf("in the sandbox: %q", res.Stdout)
			}
			file := filepath.Join(data, "workspaces", "default", "private", "secret.txt")
			if b, err := os.ReadFile(file); err != nil || string(b) != "secret\n" {
				t.Fatalf("the file on the host: %q %v", b, err)
			}
			if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != 0o700 {
				t.Errorf("data directory: %v %v, want mode 0700", fi.Mode(), err)
			}
			// nobody, with no groups, tries.
			for _, args := range [][]string{{"cat", file}, {"ls", data}, {"ls", filepath.Join(data, "workspaces")}} {
				cmd := exec.Command(args[0], args[1:]...)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
				out, err := cmd.CombinedOutput()
				if err == nil || !strings.Contains(string(out), "Permission denied") {
					t.Errorf("%s as an unprivileged user: %v: %s, want permission denied", strings.Join(args, " "), err, out)
				}
			}
		})
	}
}
