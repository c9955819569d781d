//go:build integration

package server_test

import (
	"context"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// Resources as sandboxed code sees them: read-only, in step with the
// manifest while the sandbox runs, and kept through a hibernation.
func TestResourcesInSandbox(t *testing.T) {
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	testenv.New(t).Rootfs(t, "python")
	id, err := c.EnsureSession(ctx, "alice", "coder", nil)
	if err != nil {
		t.Fatal(err)
	}
	skills := map[string][]byte{"skills/pdf/SKILL.md": []byte("v1"), "commands/review.md": []byte("review")}
	if _, err := c.SyncResources(ctx, id, skills); err != nil {
		t.Fatal(err)
	}
	read := `import os
r = '/workspace/.resources'
out = {'skill': open(r + '/skills/pdf/SKILL.md').read(), 'files': sorted(os.listdir(r))}
for name, op in [('write', lambda: open(r + '/skills/pdf/SKILL.md', 'w')),
                 ('create', lambda: open(r + '/new.md', 'w')),
                 ('remove', lambda: os.remove(r + '/commands/review.md')),
                 ('chmod', lambda: os.chmod(r + '/skills/pdf/SKILL.md', 0o666))]:
    try:
        op()
        out[name] = 'allowed'
    except PermissionError:
        out[name] = 'refused'
return out`
	res := execOK(t, c, id, api.ExecuteRequest{Code: read})
	if want := `{"skill":"v1","files":[".sbx-manifest.json","commands","skills"],"write":"refused","create":"refused","remove":"refused","chmod":"refused"}`; string(res.ReturnValue) != want {
		t.Fatalf("resources in the sandbox: %s\nwant %s", res.ReturnValue, want)
	}
	// A change reaches the running sandbox.
	skills["skills/pdf/SKILL.md"] = []byte("v2")
	if _, err := c.SyncResources(ctx, id, skills); err != nil {
		t.Fatal(err)
	}
	res = execOK(t, c, id, api.ExecuteRequest{Code: "return open('/workspace/.resources/skills/pdf/SKILL.md').read()"})
	if string(res.ReturnValue) != `"v2"` {
		t.Fatalf("after a change: %s", res.ReturnValue)
	}
	// Through a hibernation: the files and the record come back, so the
	// next sync is one request that sends nothing.
	if _, err := c.HibernateSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	again, err := c.SyncResources(ctx, id, skills)
	if err != nil || again.Requests != 1 || again.Unchanged != 2 {
		t.Fatalf("sync after hibernation: %v %+v", err, again)
	}
	res = execOK(t, c, id, api.ExecuteRequest{Code: "return open('/workspace/.resources/skills/pdf/SKILL.md').read()"})
	if string(res.ReturnValue) != `"v2"` {
		t.Fatalf("after hibernation: %s", res.ReturnValue)
	}
}
