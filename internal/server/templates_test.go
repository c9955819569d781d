package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// fakeTemplateBuild writes a build of spec, as tenant's, into the test
// server's template store, as a finished build leaves it: a post of that
// spec is then ready at once, and no test needs debootstrap.
func fakeTemplateBuild(t *testing.T, ts *testServer, tenant string, spec template.Spec) string {
	t.Helper()
	spec.Owner = tenant
	hash := spec.HashWithShift(template.DefaultUIDShift)
	dir := filepath.Join(ts.dir, "templates", "builds", hash)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"build.json": map[string]any{"hash": hash, "size_bytes": 8192, "built_at": time.Now().UTC()},
		"spec.json":  spec,
	} {
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return hash
}

// TestTemplatesAPI: the list, a post of a built spec, the
// refusals, one tenant's template invisible to another, and a delete
// refused while a session uses the template.
func TestTemplatesAPI(t *testing.T) {
	ts := start(t, "key-alpha-123:alpha", "key-beta-4567:beta")
	alpha, beta := ts.client("key-alpha-123"), ts.client("key-beta-4567")
	ctx := context.Background()

	list, err := alpha.Templates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tm := range list.Templates {
		names = append(names, tm.Name+":"+tm.Source)
	}
	if got := strings.Join(names, " "); !strings.Contains(got, "python:builtin") {
		t.Errorf("templates: %s", got)
	}

	spec := template.Spec{Name: "mine", Files: map[string]string{"/etc/mine": "1"}, Env: map[string]string{"MINE": "1"}}
	hash := fakeTemplateBuild(t, ts, "alpha", spec)
	got, queued, err := alpha.CreateTemplate(ctx, spec)
	if err != nil || queued || got.Status != api.TemplateReady || got.Hash != hash || got.Source != "tenant" || len(got.Versions) != 1 {
		t.Fatalf("CreateTemplate = %+v, queued %v, %v", got, queued, err)
	}
	if got, err := alpha.Template(ctx, "mine"); err != nil || got.Hash != hash || got.SizeBytes != 8192 {
		t.Errorf("Template = %+v, %v", got, err)
	}

	// Beta sees nothing of it, cannot use, cancel or delete it, and has
	// its own of the same name.
	notFound := func(what string, err error) {
		t.Helper()
		var apiErr *client.APIError
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Errorf("%s = %v; want 404", what, err)
		}
	}
	_, err = beta.Template(ctx, "mine")
	notFound("beta's Template", err)
	notFound("beta's delete", beta.DeleteTemplate(ctx, "mine", true))
	_, err = beta.CancelTemplateBuild(ctx, "mine", got.Build.BuildID)
	notFound("beta's cancel", err)
	if list, _ := beta.Templates(ctx); list != nil {
		for _, tm := range list.Templates {
			if tm.Name == "mine" {
				t.Errorf("beta lists %+v", tm)
			}
		}
	}
	if _, _, err := beta.CreateSession(ctx, api.CreateSessionRequest{TemplateID: "mine"}); err == nil {
		t.Error("beta made a session of alpha's template")
	}
	betaHash := fakeTemplateBuild(t, ts, "beta", spec)
	if betaHash == hash {
		t.Fatal("two tenants' builds of one spec share a hash")
	}
	if got, _, err := beta.CreateTemplate(ctx, spec); err != nil || got.Hash != betaHash {
		t.Errorf("beta's own: %+v, %v", got, err)
	}

	// Refusals.
	for _, tc := range []struct {
		body string
		code int
	}{
		{`{"name":"python"}`, http.StatusConflict},
		{`{"name":"Bad"}`, http.StatusBadRequest},
		{`{"name":"x","pakages":["y"]}`, http.StatusBadRequest},
		{`{"name":"x","files":{"/etc/x":"` + strings.Repeat("a", 800<<10) + `"}}`, http.StatusRequestEntityTooLarge},
	} {
		resp, body := ts.do(t, http.MethodPost, api.Prefix+"/templates", "application/json", strings.NewReader(tc.body), "Authorization", "Bearer key-alpha-123")
		if resp.StatusCode != tc.code {
			t.Errorf("POST %.60s: %d %s; want %d", tc.body, resp.StatusCode, body, tc.code)
		}
	}
	if resp, body := ts.do(t, http.MethodDelete, api.Prefix+"/templates/python", "", nil, "Authorization", "Bearer key-alpha-123"); resp.StatusCode != http.StatusConflict {
		t.Errorf("DELETE a built-in: %d %s", resp.StatusCode, body)
	}
	if resp, body := ts.do(t, http.MethodDelete, api.Prefix+"/templates/mine?force=maybe", "", nil, "Authorization", "Bearer key-alpha-123"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("DELETE force=maybe: %d %s", resp.StatusCode, body)
	}
	if _, err := alpha.CancelTemplateBuild(ctx, "mine", got.Build.BuildID); err == nil {
		t.Error("cancelled a build that has ended")
	}

	// A session uses it: the delete is refused, then forced.
	s, _, err := alpha.CreateSession(ctx, api.CreateSessionRequest{TemplateID: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	var apiErr *client.APIError
	if err := alpha.DeleteTemplate(ctx, "mine", false); !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusConflict {
		t.Errorf("delete while a session uses it = %v; want 409", err)
	}
	if err := alpha.DeleteTemplate(ctx, "mine", true); err != nil {
		t.Errorf("forced delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ts.dir, "templates", "builds", hash)); err != nil {
		t.Errorf("the forced delete removed the build the session runs on: %v", err)
	}
	if _, err := alpha.DeleteSession(ctx, s.SessionID); err != nil {
		t.Fatal(err)
	}
	// Beta's, unused, goes with its build.
	if err := beta.DeleteTemplate(ctx, "mine", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ts.dir, "templates", "builds", betaHash)); !os.IsNotExist(err) {
		t.Errorf("beta's deleted template's build: %v", err)
	}
}
