//go:build integration

package server_test

import (
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
)

// Two independent servers (their own data directories, so their own
// stores) on one host share the runtime's state directory, as two
// `sbx serve` with the default /run/sbx do. A server that starts used to
// destroy every sandbox there that its own store did not name: the other
// server's. Now each leaves the other's alone, and a restarted server
// still adopts its own.
func TestIndependentServersShareRuntimeState(t *testing.T) {
	off := func(c *app.Config) { c.WorkspaceQuota = "off" }
	dirA := t.TempDir()
	a := startReal(t, dirA, off)
	ca := client.New(a.URL)
	newSession(t, ca, api.CreateSessionRequest{SessionID: "mine", TemplateID: "python"})
	// /tmp is the sandbox's own tmpfs: the marker says the sandbox lived on.
	execOK(t, ca, "mine", api.ExecuteRequest{Language: "bash", Code: "echo alive > /tmp/marker"})

	b := startReal(t, t.TempDir(), off)
	cb := client.New(b.URL)
	newSession(t, cb, api.CreateSessionRequest{SessionID: "theirs", TemplateID: "python"})
	execOK(t, cb, "theirs", api.ExecuteRequest{Language: "bash", Code: "echo alive > /tmp/marker"})
	if res := execOK(t, ca, "mine", api.ExecuteRequest{Language: "bash", Code: "cat /tmp/marker"}); res.Stdout != "alive\n" {
		t.Fatalf("A's sandbox after B started: %q (a new sandbox)", res.Stdout)
	}

	// A restarts: it adopts its own sandbox and leaves B's.
	a.stop()
	a = startReal(t, dirA, off)
	ca = client.New(a.URL)
	for c, sid := range map[*client.Client]string{ca: "mine", cb: "theirs"} {
		if res := execOK(t, c, sid, api.ExecuteRequest{Language: "bash", Code: "cat /tmp/marker"}); res.Stdout != "alive\n" {
			t.Errorf("%s after A's restart: %q (a new sandbox)", sid, res.Stdout)
		}
	}
}
