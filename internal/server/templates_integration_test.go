//go:build integration

package server_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// TestTemplateOverHTTP: a template defined over the API is built
// for real, its log streamed; sessions run on it; a new version builds
// while the sessions keep the version they started on, even on a new
// sandbox after hibernation; a cancelled build leaves nothing and new
// sessions keep the last version built; the delete waits for the
// sessions, then takes the builds with it.
func TestTemplateOverHTTP(t *testing.T) {
	testenv.New(t).Rootfs(t, "python") // the base layer, built once per machine
	rs := startReal(t, t.TempDir())
	c := client.New(rs.URL)
	ctx := context.Background()
	b := make([]byte, 6)
	rand.Read(b)
	nonce := hex.EncodeToString(b) // a build of an earlier run must not answer for this one
	name := "pin-" + nonce
	spec := func(v string) map[string]any {
		return map[string]any{"name": name, "files": map[string]string{"/etc/sbx-pin": v + " " + nonce}, "env": map[string]string{"PIN_ENV": v}}
	}
	build := func(v string) *api.Template {
		t.Helper()
		tm, queued, err := c.CreateTemplate(ctx, spec(v))
		if err != nil || !queued || tm.Build == nil {
			t.Fatalf("CreateTemplate(%s) = %+v, queued %v, %v", v, tm, queued, err)
		}
		var log strings.Builder
		end, err := c.FollowTemplateBuild(ctx, name, tm.Build.BuildID, func(line string) { log.WriteString(line) })
		if err != nil {
			t.Fatal(err)
		}
		if end.Status != api.TemplateReady || end.Hash != tm.Hash {
			t.Fatalf("build of %s ended %+v\n%s", v, end, log.String())
		}
		if !strings.Contains(log.String(), "[5/5]") {
			t.Errorf("build log of %s:\n%s", v, log.String())
		}
		return end
	}
	pin := func(sid string) string {
		t.Helper()
		res := execOK(t, c, sid, api.ExecuteRequest{Code: "import os\nprint(open('/etc/sbx-pin').read().split()[0], os.environ['PIN_ENV'])"})
		return strings.TrimSpace(res.Stdout)
	}
	session := func(id string) {
		t.Helper()
		if _, _, err := c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id, TemplateID: name}); err != nil {
			t.Fatal(err)
		}
	}

	v1 := build("v1")
	session("s1")
	if got := pin("s1"); got != "v1 v1" {
		t.Fatalf("s1 runs %q; want v1", got)
	}
	v2 := build("v2")
	if v2.Hash == v1.Hash || len(v2.Versions) != 2 {
		t.Fatalf("v2: %+v", v2)
	}
	if got := pin("s1"); got != "v1 v1" {
		t.Errorf("s1 after v2 was built runs %q; want v1", got)
	}
	// A new sandbox for s1 (hibernation destroys it) keeps its version's
	// rootfs; the environment follows the template's definition.
	if _, err := c.HibernateSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if got := pin("s1"); !strings.HasPrefix(got, "v1 ") {
		t.Errorf("s1 after hibernation runs %q; want the v1 rootfs", got)
	}
	session("s2")
	if got := pin("s2"); got != "v2 v2" {
		t.Errorf("a new session runs %q; want v2", got)
	}

	// A build cancelled at once ends cancelled and leaves nothing behind;
	// new sessions keep getting v2.
	v3, queued, err := c.CreateTemplate(ctx, spec("v3"))
	if err != nil || !queued {
		t.Fatalf("v3: %+v, %v, %v", v3, queued, err)
	}
	if _, err := c.CancelTemplateBuild(ctx, name, v3.Build.BuildID); err != nil {
		t.Fatal(err)
	}
	end, err := c.FollowTemplateBuild(ctx, name, v3.Build.BuildID, nil)
	if err != nil || end.Status != api.TemplateCancelled {
		t.Fatalf("cancelled build ended %+v, %v", end, err)
	}
	if _, err := os.Stat(filepath.Join(testenv.TemplateDir(), "builds", v3.Hash)); !os.IsNotExist(err) {
		t.Errorf("the cancelled build left %v", err)
	}
	session("s3")
	if got := pin("s3"); got != "v2 v2" {
		t.Errorf("a session after the cancel runs %q; want v2", got)
	}

	// The plain-text log of a finished build.
	resp, body := doRaw(t, http.MethodGet, rs.URL+api.Prefix+"/templates/"+name+"/builds/"+v1.Build.BuildID+"/logs")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "[5/5]") {
		t.Errorf("plain log: %d %.300s", resp.StatusCode, body)
	}

	var apiErr *client.APIError
	if err := c.DeleteTemplate(ctx, name, false); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict {
		t.Fatalf("delete while sessions use it = %v; want 409", err)
	}
	for _, sid := range []string{"s1", "s2", "s3"} {
		if _, err := c.DeleteSession(ctx, sid); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteTemplate(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{v1.Hash, v2.Hash} {
		if _, err := os.Stat(filepath.Join(testenv.TemplateDir(), "builds", h)); !os.IsNotExist(err) {
			t.Errorf("build %s of the deleted template: %v", h[:12], err)
		}
	}
}

// doRaw sends a request without the client, and reads the whole answer.
func doRaw(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, sb.String()
}
