// Package console is the web console: a page, a stylesheet and
// JavaScript modules, embedded in the binary and served at /ui/ with no
// build step and nothing fetched from elsewhere, so it works on a machine
// with no internet. The files are public: the page asks for an API key
// and calls the API with it, which is where every check happens.
//
// The page renders data that sandboxed code controls (file names,
// outputs, errors): its scripts build the DOM from text nodes only, and
// the Content-Security-Policy here makes the browser refuse anything else
// (no inline script, no eval, Trusted Types with no policy, so no HTML
// string can ever become markup).
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// Prefix is where the console is served; the bare "/ui" redirects here.
const Prefix = "/ui/"

// Policy is the console's Content-Security-Policy: its own origin for
// scripts, styles, images and API calls, nothing inline, no plugins, no
// framing, no <base> and no HTML strings made into markup. (Charts are
// SVG elements, downloads blob: URLs the page navigates to: neither
// needs more.)
const Policy = "default-src 'self'; script-src 'self'; style-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

//go:embed static
var static embed.FS

// asset is one embedded file, ready to serve.
type asset struct {
	body  []byte
	ctype string
	etag  string
}

// types are the content types of what the console is made of; a file of
// another kind is a mistake caught when the assets are loaded.
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// assets maps a path under Prefix ("" is the page) to its file.
var assets = mustLoad()

func mustLoad() map[string]asset {
	m, err := load(static)
	if err != nil {
		panic(err)
	}
	return m
}

func load(fsys fs.FS) (map[string]asset, error) {
	m := map[string]asset{}
	err := fs.WalkDir(fsys, "static", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ctype, ok := types[path.Ext(name)]
		if !ok {
			return fmt.Errorf("console: %s: no content type for %q", name, path.Ext(name))
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		rel := strings.TrimPrefix(name, "static/")
		m[rel] = asset{body: body, ctype: ctype, etag: `"` + base64.RawURLEncoding.EncodeToString(sum[:12]) + `"`}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if _, ok := m["index.html"]; !ok {
		return nil, fmt.Errorf("console: no index.html")
	}
	m[""] = m["index.html"]
	return m, nil
}

// Handler serves the console under Prefix. The files are revalidated on
// every load (Cache-Control: no-cache, a 304 while the ETag, a hash of
// the content, is the same): the modules import each other by plain
// names, so a browser must never mix files of two versions.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		setHeaders(h)
		a, ok := assets[strings.TrimPrefix(r.URL.Path, Prefix)]
		if !ok || !strings.HasPrefix(r.URL.Path, Prefix) {
			h.Set("Cache-Control", "no-store")
			http.Error(w, "no such file in the console", http.StatusNotFound)
			return
		}
		h.Set("Content-Type", a.ctype)
		h.Set("ETag", a.etag)
		h.Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	})
}

// setHeaders sets the console's security headers, replacing the API's
// (whose policy, a sandbox with no script, would stop the page).
func setHeaders(h http.Header) {
	h.Set("Content-Security-Policy", Policy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	h.Set("Permissions-Policy", "camera=(), microphone=(), geolocation=(), usb=(), payment=()")
}
