package console

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sbx-sandbox/sbx/api"
)

func get(t *testing.T, h http.Handler, path string, hdr ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

// TestServes: the page and its files with their types, the security
// headers on every answer (a 404 too), revalidation by ETag, and 404 for
// what the console does not have.
func TestServes(t *testing.T) {
	h := Handler()
	for _, tc := range []struct {
		path, ctype, has string
		status           int
	}{
		{"/ui/", "text/html; charset=utf-8", `<script type="module" src="js/app.js"></script>`, 200},
		{"/ui/index.html", "text/html; charset=utf-8", "<title>sbx console</title>", 200},
		{"/ui/app.css", "text/css; charset=utf-8", "prefers-color-scheme: dark", 200},
		{"/ui/js/app.js", "text/javascript; charset=utf-8", "import", 200},
		{"/ui/js/api.js", "text/javascript; charset=utf-8", "sessionStorage", 200},
		{"/ui/icon.svg", "image/svg+xml", "<svg", 200},
		{"/ui/nope.js", "text/plain; charset=utf-8", "no such file", 404},
		{"/ui/js/", "text/plain; charset=utf-8", "no such file", 404},
		{"/ui/static/index.html", "text/plain; charset=utf-8", "no such file", 404},
		{"/ui/js/app.js/x", "text/plain; charset=utf-8", "no such file", 404},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp := get(t, h, tc.path)
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != tc.ctype || !strings.Contains(string(body), tc.has) {
				t.Fatalf("%d %q, want %d %q with %q:\n%.300s", resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, tc.ctype, tc.has, body)
			}
			for name, want := range map[string]string{
				"Content-Security-Policy": Policy,
				"X-Content-Type-Options":  "nosniff",
				"X-Frame-Options":         "DENY",
				"Referrer-Policy":         "no-referrer",
			} {
				if got := resp.Header.Get(name); got != want {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
			if tc.status != 200 {
				return
			}
			etag := resp.Header.Get("ETag")
			if etag == "" || resp.Header.Get("Cache-Control") != "no-cache" {
				t.Fatalf("ETag %q, Cache-Control %q", etag, resp.Header.Get("Cache-Control"))
			}
			if again := get(t, h, tc.path, "If-None-Match", etag); again.StatusCode != http.StatusNotModified {
				t.Errorf("If-None-Match with the ETag: %d, want 304", again.StatusCode)
			}
		})
	}
}

// TestPolicy: the policy allows nothing but the console's own files, and
// no way for a string to become script or markup.
func TestPolicy(t *testing.T) {
	for _, want := range []string{
		"default-src 'self'", "script-src 'self'", "object-src 'none'", "base-uri 'none'",
		"frame-ancestors 'none'", "require-trusted-types-for 'script'", "trusted-types 'none'",
	} {
		if !strings.Contains(Policy, want) {
			t.Errorf("the policy lacks %q: %s", want, Policy)
		}
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "http:", "https:", "*"} {
		if strings.Contains(Policy, bad) {
			t.Errorf("the policy allows %q: %s", bad, Policy)
		}
	}
}

func files(t *testing.T, ext string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, a := range assets {
		if name != "" && strings.HasSuffix(name, ext) {
			out[name] = string(a.body)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no %s files", ext)
	}
	return out
}

// TestNoMarkupFromStrings: the scripts never turn a string into markup or
// code (the policy would refuse it at run time; this says where, before),
// and the page has no inline script, handler or style for the policy to
// block.
func TestNoMarkupFromStrings(t *testing.T) {
	sinks := regexp.MustCompile(`\.(innerHTML|outerHTML|insertAdjacentHTML)\b|document\.write|\beval\(|new Function\b|setTimeout\(\s*['"\x60]|createContextualFragment|DOMParser`)
	for name, src := range files(t, ".js") {
		for _, m := range sinks.FindAllString(src, -1) {
			t.Errorf("%s: %s: build the DOM from text nodes (dom.js h)", name, m)
		}
	}
	page := string(assets["index.html"].body)
	for _, re := range []string{`<script(?:\s+type="module")?>`, `\son[a-z]+=`, `\sstyle=`, `<style`, `https?://`} {
		if m := regexp.MustCompile(re).FindString(page); m != "" {
			t.Errorf("index.html has %q, which the policy refuses or which reaches outside", m)
		}
	}
}

// TestEveryReferenceServed: what the page and the modules load is in the
// console, and every file the console has is loaded by something, so
// nothing is fetched from elsewhere or left behind.
func TestEveryReferenceServed(t *testing.T) {
	used := map[string]bool{"index.html": true}
	page := string(assets["index.html"].body)
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"#]+)"`).FindAllStringSubmatch(page, -1) {
		used[m[1]] = true
	}
	for name, src := range files(t, ".js") {
		for _, m := range regexp.MustCompile(`(?m)^import [^;]* from '\./([^']+)';`).FindAllStringSubmatch(src, -1) {
			used["js/"+m[1]] = true
		}
		if strings.Contains(src, "import(") {
			t.Errorf("%s: dynamic import", name)
		}
	}
	for name := range used {
		if _, ok := assets[name]; !ok {
			t.Errorf("%s is loaded but not in the console", name)
		}
	}
	for name := range assets {
		if name != "" && !used[name] {
			t.Errorf("%s is in the console but nothing loads it", name)
		}
	}
}

// TestSmall: the console stays a few tens of KB.
func TestSmall(t *testing.T) {
	total := 0
	for name, a := range assets {
		if name != "" {
			total += len(a.body)
			t.Logf("%-18s %6d bytes", name, len(a.body))
		}
	}
	t.Logf("%-18s %6d bytes", "total", total)
	if total > 96<<10 {
		t.Errorf("the console is %d bytes; keep it under 96 KiB", total)
	}
}

var (
	// apiLiteral is any string literal naming an API path.
	apiLiteral = regexp.MustCompile("[`'\"]/api/v1/")
	// apiCall is a call of api.js with its method and path as literals.
	apiCall = regexp.MustCompile("\\b(?:call|request|stream)\\('([A-Z]+)',\\s*`(/api/v1/[^`]*)`")
	// query is a q({...}) helper at the end of a path.
	query    = regexp.MustCompile(`\$\{q\((\{[^` + "`" + `]*\})\)\}$`)
	queryKey = regexp.MustCompile(`(?:^\{|,)\s*([A-Za-z_]\w*)\s*:`)
	param    = regexp.MustCompile(`^\$\{[^}]+\}$`)
)

// TestAPICallsInContract: every API call the console makes, its method,
// path and query parameters, is an operation of api/openapi.yaml, so the
// console cannot drift from the contract. Paths are template literals
// whose ${...} are whole segments; a query is a q({...}) at the end.
func TestAPICallsInContract(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for name, src := range files(t, ".js") {
		literals := len(apiLiteral.FindAllString(src, -1))
		calls := apiCall.FindAllStringSubmatch(src, -1)
		if literals != len(calls) {
			t.Errorf("%s: %d API path literals, %d in call('METHOD', `path`) form: write every call that way", name, literals, len(calls))
		}
		for _, c := range calls {
			seen++
			method, path := c[1], c[2]
			var keys []string
			if m := query.FindStringSubmatch(path); m != nil {
				for _, k := range queryKey.FindAllStringSubmatch(m[1], -1) {
					keys = append(keys, k[1])
				}
				path = strings.TrimSuffix(path, m[0])
			}
			if err := inContract(doc, method, path, keys); err != nil {
				t.Errorf("%s: %s %s: %v", name, method, c[2], err)
			}
		}
	}
	if seen < 20 {
		t.Errorf("found %d API calls; the pattern no longer matches the scripts", seen)
	}
}

func inContract(doc *openapi3.T, method, path string, keys []string) error {
	if strings.ContainsAny(path, "?#") {
		return fmt.Errorf("a literal query: use ${q({...})}")
	}
	segs := strings.Split(path, "/")
	norm := make([]string, len(segs))
	for i, s := range segs {
		switch {
		case param.MatchString(s):
			norm[i] = "{}"
		case strings.Contains(s, "${"):
			return fmt.Errorf("segment %q: a ${...} must be a whole segment", s)
		default:
			norm[i] = s
		}
	}
	for tmpl, item := range doc.Paths.Map() {
		ts := strings.Split(tmpl, "/")
		if len(ts) != len(norm) {
			continue
		}
		match := true
		for i, s := range ts {
			isParam := strings.HasPrefix(s, "{")
			if (isParam && norm[i] != "{}") || (!isParam && s != norm[i]) {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		op := item.GetOperation(method)
		if op == nil {
			return fmt.Errorf("%s has no %s", tmpl, method)
		}
		var declared []string
		for _, ps := range []openapi3.Parameters{item.Parameters, op.Parameters} {
			for _, p := range ps {
				if p.Value.In == openapi3.ParameterInQuery {
					declared = append(declared, p.Value.Name)
				}
			}
		}
		for _, k := range keys {
			if !slices.Contains(declared, k) {
				return fmt.Errorf("query parameter %q is not one of %s %s's (%v)", k, method, tmpl, declared)
			}
		}
		return nil
	}
	return fmt.Errorf("no such path in api/openapi.yaml")
}
