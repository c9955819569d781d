package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/apitest"
)

// TestTemplateRemote: with --server, build posts the spec and shows the
// build's log as it comes, then the result; ls lists the server's
// templates; rm deletes with force when asked.
func TestTemplateRemote(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	queued := api.Template{Name: "mine", Source: "tenant", Status: api.TemplateQueued, Hash: hash, Runtime: "runc", Release: "bookworm",
		Build: &api.TemplateBuild{BuildID: "bld_1", Hash: hash, Status: api.TemplateQueued, QueuedAt: testTime}}
	ready := queued
	ready.Status, ready.SizeBytes = api.TemplateReady, 5<<20
	ready.Build = &api.TemplateBuild{BuildID: "bld_1", Hash: hash, Status: api.TemplateReady, QueuedAt: testTime}
	var got []string
	mux := http.NewServeMux()
	p := api.Prefix
	mux.HandleFunc("POST "+p+"/templates", func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI())
		sendJSON(w, 202, queued)
	})
	mux.HandleFunc("GET "+p+"/templates/mine/builds/bld_1/logs", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "event: log\ndata: {\"text\":\"[1/5] base\\n\"}\n\n")
		fmt.Fprint(w, "event: log\ndata: {\"text\":\"[5/5] done\\n\"}\n\n")
		fmt.Fprintf(w, "event: end\ndata: %s\n\n", mustJSON(ready))
	})
	mux.HandleFunc("GET "+p+"/templates", func(w http.ResponseWriter, r *http.Request) {
		sendJSON(w, 200, api.TemplateList{Templates: []api.Template{ready}})
	})
	mux.HandleFunc("DELETE "+p+"/templates/mine", func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.RequestURI())
		w.WriteHeader(204)
	})
	srv := httptest.NewServer(apitest.Handler(t, mux))
	defer srv.Close()

	file := filepath.Join(t.TempDir(), "spec.json")
	os.WriteFile(file, []byte(`{"name":"mine","packages":["jq"]}`), 0o644)
	var stdout, stderr bytes.Buffer
	if code := runTemplate(context.Background(), []string{"build", "--server", srv.URL, "--file", file}, &stdout, &stderr); code != 0 {
		t.Fatalf("build: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "[1/5] base\n[5/5] done\n") || stdout.String() != "mine abababababab 5 MB ready\n" {
		t.Errorf("build: stdout %q, stderr %q", stdout.String(), stderr.String())
	}
	stdout.Reset()
	if code := runTemplate(context.Background(), []string{"ls", "--server", srv.URL}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "mine  tenant  ready") {
		t.Errorf("ls: exit %d, %q", code, stdout.String())
	}
	if code := runTemplate(context.Background(), []string{"rm", "mine", "--server", srv.URL, "--force"}, &stdout, &stderr); code != 0 {
		t.Errorf("rm: exit %d, %s", code, stderr.String())
	}
	if want := "POST /api/v1/templates DELETE /api/v1/templates/mine?force=true"; strings.Join(got, " ") != want {
		t.Errorf("requests %q; want %q", got, want)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
