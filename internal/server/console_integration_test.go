//go:build integration

package server_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/server"
)

// chromium is Debian's chromium: the test skips without it, and fails
// under CI, where scripts/setup.sh installs it.
func chromium(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		msg := "the console's browser tests need Debian's chromium (apt-get install chromium; scripts/setup.sh installs it for its test targets)"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// tab is a tab of a headless Chromium, with what the page did that it
// must not: dialogs (alert() of injected markup), uncaught exceptions and
// refusals of the Content-Security-Policy.
type tab struct {
	t         *testing.T
	ctx       context.Context
	downloads string

	mu        sync.Mutex
	bad       []string
	completed map[string]string // download guid -> state
	names     map[string]string // download guid -> suggested file name
	wg        sync.WaitGroup
}

// startBrowser starts Chromium with a new empty profile and returns a tab.
// At the test's end the browser is closed and the test fails if any of its
// processes (found by the profile directory on their command lines, which
// Chromium passes to every child) is still alive.
func startBrowser(t *testing.T) *tab {
	t.Helper()
	path := chromium(t)
	profile := t.TempDir()
	downloads := t.TempDir()
	actx, acancel := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.UserDataDir(profile),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1280, 1000),
	)
	ctx, cancel := chromedp.NewContext(actx)
	tb := &tab{t: t, ctx: ctx, downloads: downloads, completed: map[string]string{}, names: map[string]string{}}
	t.Cleanup(func() {
		// A graceful close: the browser ends its own children (a kill
		// leaves them for init to reap).
		cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
		if err := chromedp.Cancel(cctx); err != nil {
			t.Logf("closing chromium: %v", err)
		}
		ccancel()
		cancel()
		acancel()
		tb.wg.Wait()
		leftovers(t, profile)
	})
	// The first call starts the browser, and lives as long as ctx: no
	// timeout on it.
	if err := chromedp.Listen(ctx, tb.listen); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	if err := chromedp.ListenBrowser(ctx, tb.listen); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: downloads, EventsEnabled: new(true),
	}); err != nil {
		t.Fatal(err)
	}
	return tb
}

// listen records what the page does (it runs in chromedp's loop: it must
// not block or send a command).
func (tb *tab) listen(ev any) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	switch e := ev.(type) {
	case *page.EventJavascriptDialogOpening:
		tb.bad = append(tb.bad, fmt.Sprintf("a %s dialog opened: %q", e.Type, e.Message))
		// Dismiss it, or the page stops.
		tb.wg.Add(1)
		go func() {
			defer tb.wg.Done()
			chromedp.Call(tb.ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}()
	case *cdpruntime.EventExceptionThrown:
		msg := e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			msg += " " + e.ExceptionDetails.Exception.Description
		}
		tb.bad = append(tb.bad, "uncaught: "+msg)
	case *cdplog.EventEntryAdded:
		// Refusals of the Content-Security-Policy and of Trusted Types
		// (an HTML string sink) are the security source's.
		if e.Entry.Source == cdplog.EntrySourceSecurity || strings.Contains(e.Entry.Text, "Content Security Policy") {
			tb.bad = append(tb.bad, "refused by the policy: "+e.Entry.Text)
		}
	case *browser.EventDownloadWillBegin:
		tb.names[e.GUID] = e.SuggestedFilename
	case *browser.EventDownloadProgress:
		if e.State != browser.DownloadProgressStateInProgress {
			tb.completed[e.GUID] = e.State.String()
		}
	}
}

// clean fails the test for anything the page did that it must not.
func (tb *tab) clean() {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, b := range tb.bad {
		tb.t.Error(b)
	}
	tb.bad = nil
}

func (tb *tab) run(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		tb.t.Fatalf("%s: %v\n%s", what, err, tb.text())
	}
}

// text is what the page shows, for failure messages.
func (tb *tab) text() string {
	ctx, cancel := context.WithTimeout(tb.ctx, 10*time.Second)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	return "the page shows:\n" + s
}

// eval evaluates a JavaScript expression.
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	ctx, cancel := context.WithTimeout(tb.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.t.Fatalf("evaluating %s: %v\n%s", expr, err, tb.text())
	}
	return v
}

// wait polls until the JavaScript expression is true: pages change when
// the server answers, so tests wait for what the page shows, never for a
// time. The bound is for a broken page, not a measure.
func (tb *tab) wait(what, expr string) {
	tb.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(tb.ctx, 30*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!(`+expr+`)`))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("waiting for %s (%s): %v\n%s", what, expr, err, tb.text())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// download waits for a download the page started and returns its name
// and bytes.
func (tb *tab) download(before int) (string, []byte) {
	tb.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		tb.mu.Lock()
		var guid, state string
		if len(tb.completed) > before {
			for g, s := range tb.completed {
				if _, seen := tb.names[g]; seen {
					guid, state = g, s
				}
			}
		}
		name := tb.names[guid]
		tb.mu.Unlock()
		if guid != "" {
			if state != browser.DownloadProgressStateCompleted.String() {
				tb.t.Fatalf("download %s: %s", name, state)
			}
			b, err := os.ReadFile(filepath.Join(tb.downloads, guid))
			if err != nil {
				tb.t.Fatal(err)
			}
			return name, b
		}
		if time.Now().After(deadline) {
			tb.t.Fatalf("no download completed\n%s", tb.text())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// leftovers fails the test if a process of the browser whose profile is
// dir is still alive once the browser has been closed (and kills it).
func leftovers(t *testing.T, dir string) {
	want := []byte("--user-data-dir=" + dir + "\x00")
	var pids []int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		pids = pids[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && bytes.Contains(cmdline, want) {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, pid := range pids {
		t.Errorf("chromium process %d is still alive after the browser was closed", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// startConsoleServer is startReal with API keys, every call checked
// against the contract.
func startConsoleServer(t *testing.T, keys ...string) *realServer {
	t.Helper()
	k, err := server.ParseKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	return startReal(t, t.TempDir(), func(c *app.Config) { c.Keys = k })
}

const hostileFile = "<img src=x onerror=alert(2)>.txt"

// TestConsoleChromium: the web console in a real headless Chromium
// against a real server with runc sandboxes and API keys: sign in, see a
// session made through the API, watch an execution's output arrive while
// it runs, upload and download a file, pause, hibernate and resume it,
// take a snapshot, and delete the session; names, output and errors that
// sandboxed code controls show as text, never as markup (no dialog, no
// refusal of the policy, no uncaught error); and another tenant's key sees
// none of it.
func TestConsoleChromium(t *testing.T) {
	const alphaKey, betaKey = "alpha-console-key", "beta-console-key"
	rs := startConsoleServer(t, alphaKey+":alpha", betaKey+":beta")
	alpha := client.New(rs.URL, client.WithAPIKey(alphaKey))
	beta := client.New(rs.URL, client.WithAPIKey(betaKey))
	ctx := context.Background()
	newSession(t, alpha, api.CreateSessionRequest{SessionID: "ui-alpha", TemplateID: "python", Metadata: map[string]string{"user_id": "alice"}})
	newSession(t, beta, api.CreateSessionRequest{SessionID: "ui-beta", TemplateID: "python"})
	execOK(t, alpha, "ui-alpha", api.ExecuteRequest{Code: fmt.Sprintf("open(%q, 'w').write('planted')", "/workspace/"+hostileFile)})
	failed, err := alpha.Execute(ctx, "ui-alpha", api.ExecuteRequest{Code: "raise ValueError('<b>x</b>')"})
	if err != nil || failed.Status != api.ExecFailed {
		t.Fatalf("the failing execution: %+v %v", failed, err)
	}

	tb := startBrowser(t)
	defer tb.clean()
	ui := rs.URL + "/ui/"

	// Sign in: a wrong key is refused, the right one kept in
	// sessionStorage only.
	tb.run("open the console", chromedp.Navigate(ui))
	tb.wait("the sign-in form, and no navigation", `document.querySelector('#signin-key') && !document.querySelector('#nav').checkVisibility()`)
	tb.run("a wrong key", chromedp.SetValue(chromedp.CSS("#signin-key"), "not-a-key-at-all"), chromedp.Click(chromedp.CSS("#signin button[type=submit]")))
	tb.wait("the refusal", `document.querySelector('#signin-status').textContent.includes('refused')`)
	signIn(tb, alphaKey)
	tb.wait("the session made through the API", `document.querySelector('#sessions tr[data-session="ui-alpha"]')`)
	stored := eval[[]any](tb, `[sessionStorage.getItem('sbx.apiKey'), localStorage.length, document.cookie]`)
	if fmt.Sprint(stored) != fmt.Sprintf("[%s 0 ]", alphaKey) {
		t.Errorf("sessionStorage key, localStorage entries, cookies: %v", stored)
	}
	tb.run("reload", chromedp.Reload())
	tb.wait("still signed in after a reload (the tab keeps its key)", `document.querySelector('#sessions tr[data-session="ui-alpha"]') && !document.querySelector('#signin')`)
	tb.run("open the session", chromedp.Click(chromedp.CSS(`#sessions tr[data-session="ui-alpha"] a`)))
	tb.wait("the session's page", `document.querySelector('#session-title')?.textContent === 'ui-alpha' && document.querySelector('#session-status')`)

	// A file name that sandboxed code chose shows as the text it is.
	tb.wait("the planted file's name as text", fmt.Sprintf(
		`[...document.querySelectorAll('#files-body th.name')].some((e) => e.textContent === %q)`, hostileFile))
	if imgs := eval[int](tb, `document.querySelectorAll('#files img, #run img, #executions img').length`); imgs != 0 {
		t.Errorf("%d img elements in the session's sections: markup from a file name", imgs)
	}

	// Run code that prints, then waits for a file only the test makes:
	// its first lines must be on the page while it still runs.
	code := "import os, time\n" +
		"print('<img src=x onerror=alert(1)>', flush=True)\n" +
		"print('first line', flush=True)\n" +
		"while not os.path.exists('/workspace/go'):\n    time.sleep(0.05)\n" +
		"print('second line', flush=True)\n" +
		"return 42"
	tb.run("run code",
		chromedp.SetValue(chromedp.CSS("#run-code"), code),
		chromedp.SetValue(chromedp.CSS("#run-timeout"), "600"),
		chromedp.Click(chromedp.CSS("#run-submit")))
	tb.wait("the first lines while the code runs", `document.querySelector('#run-output').textContent.includes('first line')`)
	if status := eval[string](tb, `document.querySelector('#run-result').dataset.status || 'none yet'`); status != "none yet" {
		t.Fatalf("the result (%s) came before the test let the code finish: the output was not live", status)
	}
	if _, err := alpha.Upload(ctx, "ui-alpha", client.UploadOptions{}, client.UploadFile{Name: "go", Reader: strings.NewReader("go")}); err != nil {
		t.Fatal(err)
	}
	tb.wait("the rest of the output and the result", `document.querySelector('#run-result').dataset.status === 'completed'`)
	out := eval[string](tb, `document.querySelector('#run-output').textContent`)
	if want := "<img src=x onerror=alert(1)>\nfirst line\nsecond line\n"; out != want {
		t.Errorf("the output on the page: %q, want %q", out, want)
	}
	if imgs := eval[int](tb, `document.querySelectorAll('#run img').length`); imgs != 0 {
		t.Errorf("%d img elements in the output: markup from stdout", imgs)
	}
	tb.wait("the return value", `document.querySelector('#run-result .ret')?.textContent === '42'`)
	tb.wait("the executions in the history", `document.querySelectorAll('#executions-body button[data-execution]').length === 3`)

	// An error that sandboxed code raised, opened from the history: text.
	tb.run("open the failed execution", chromedp.Click(chromedp.CSS(`#executions-body button[data-execution="`+failed.ExecutionID+`"]`)))
	tb.wait("its error as text", `document.querySelector('#execution-detail pre.err')?.textContent.startsWith('ValueError: <b>x</b>')`)
	if n := eval[int](tb, `document.querySelectorAll('#execution-detail b').length`); n != 0 {
		t.Errorf("%d b elements in the execution's details: markup from an error", n)
	}

	// Upload through the page, then download through it: the same bytes.
	content := make([]byte, 0, 300)
	content = append(content, "from the browser\n"...)
	for i := range 256 {
		content = append(content, byte(i))
	}
	local := filepath.Join(t.TempDir(), "notes.bin")
	if err := os.WriteFile(local, content, 0o644); err != nil {
		t.Fatal(err)
	}
	tb.run("upload", chromedp.SetUploadFiles(chromedp.CSS("#upload-input"), []string{local}), chromedp.Click(chromedp.CSS("#upload-submit")))
	tb.wait("the uploaded file", `document.querySelector('#files-body tr[data-path="notes.bin"]')`)
	rc, err := alpha.OpenFile(ctx, "ui-alpha", "notes.bin", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, content) {
		t.Errorf("the upload stored %q", got)
	}
	tb.mu.Lock()
	before := len(tb.completed)
	tb.mu.Unlock()
	tb.run("download", chromedp.Click(chromedp.CSS(`#files-body tr[data-path="notes.bin"] button.download`)))
	name, got := tb.download(before)
	if name != "notes.bin" || !bytes.Equal(got, content) {
		t.Errorf("downloaded %q: %q, want notes.bin: %q", name, got, content)
	}

	// The sandbox's metrics, its lifecycle through the page's buttons, a
	// snapshot, and the events that told of them.
	tb.wait("the metrics charts", `document.querySelectorAll('#metrics-charts figure').length >= 2`)
	for _, step := range []struct{ button, state string }{
		{"#act-pause", `document.querySelector('#session-sandbox').textContent === 'paused'`},
		{"#act-resume", `document.querySelector('#session-sandbox').textContent === 'running'`},
		{"#act-hibernate", `document.querySelector('#session-status .badge').textContent === 'hibernated'`},
		{"#act-resume", `document.querySelector('#session-status .badge').textContent === 'running'`},
	} {
		tb.run(step.button, chromedp.Click(chromedp.CSS(step.button)))
		tb.wait("the state after "+step.button, step.state+` && document.querySelector('#action-status').textContent.endsWith('done.')`)
	}
	tb.run("take a snapshot", chromedp.Click(chromedp.CSS("#snapshot-create")))
	tb.wait("the snapshot", `document.querySelector('#snapshots tbody code')?.textContent.startsWith('snap-')`)
	tb.run("refresh the events", chromedp.Click(chromedp.CSS("#events button")))
	tb.wait("the events of what the page did", `(() => {
		const types = [...document.querySelectorAll('#events-body tbody th code')].map((c) => c.textContent);
		return ['session.created', 'session.paused', 'session.resumed', 'session.hibernated', 'session.restored', 'session.snapshot'].every((t) => types.includes(t));
	})()`)

	// Pages that need no sandbox: templates.
	tb.run("templates", chromedp.Navigate(ui+"#/templates"))
	tb.wait("the python template", `document.querySelector('#templates-body tr[data-template="python"]')`)
	// /metrics names every tenant: on a server with keys it is not
	// the tenants', so the console shows no Pools link.
	tb.wait("the probe of /metrics", `document.querySelector('#nav-pools').dataset.probed`)
	if shown := eval[[]any](tb, `[document.querySelector('#nav-pools').dataset.probed, document.querySelector('#nav-pools').checkVisibility()]`); fmt.Sprint(shown) != "[no false]" {
		t.Errorf("the pools link on a server with keys (probed, visible): %v", shown)
	}

	// Another tenant sees its own session and none of alpha's.
	tb.run("sign out", chromedp.Click(chromedp.CSS("#signout")))
	tb.wait("the sign-in form again", `document.querySelector('#signin-key') && sessionStorage.getItem('sbx.apiKey') === null`)
	signIn(tb, betaKey)
	tb.run("beta's sessions", chromedp.Navigate(ui+"#/sessions"))
	tb.wait("beta's own session", `document.querySelector('#sessions tr[data-session="ui-beta"]')`)
	if rows := eval[int](tb, `document.querySelectorAll('#sessions tbody tr[data-session]').length`); rows != 1 {
		t.Errorf("beta's console lists %d sessions, want only its own", rows)
	}
	tb.run("alpha's session by its address", chromedp.Navigate(ui+"#/sessions/ui-alpha"))
	tb.wait("not found", `document.querySelector('main .error')?.textContent.includes('not found')`)
	tb.run("sign out", chromedp.Click(chromedp.CSS("#signout")))

	// Delete through the page, after its own confirmation.
	signIn(tb, alphaKey)
	tb.run("alpha's session", chromedp.Navigate(ui+"#/sessions/ui-alpha"))
	tb.wait("the session's page", `document.querySelector('#session-status')`)
	tb.run("delete", chromedp.Click(chromedp.CSS("#act-delete")))
	tb.wait("the confirmation", `document.querySelector('#confirm').open`)
	tb.run("confirm", chromedp.Click(chromedp.CSS("#confirm-ok")))
	tb.wait("back at the list", `location.hash === '#/sessions' && document.querySelector('#sessions')?.dataset.loaded`)
	s, err := alpha.GetSession(ctx, "ui-alpha")
	if err != nil && !client.IsNotFound(err) {
		t.Fatal(err)
	}
	if err == nil && s.Status != api.StatusTerminated {
		t.Errorf("after the delete the session is %s", s.Status)
	}
	if _, err := beta.GetSession(ctx, "ui-beta"); err != nil {
		t.Errorf("beta's session: %v", err)
	}
}

func signIn(tb *tab, key string) {
	tb.t.Helper()
	tb.wait("the sign-in form", `document.querySelector('#signin-key')`)
	tb.run("sign in", chromedp.SetValue(chromedp.CSS("#signin-key"), key), chromedp.Click(chromedp.CSS("#signin button[type=submit]")))
	tb.wait("signed in", `!document.querySelector('#signin') && document.querySelector('#nav').checkVisibility()`)
}

// TestConsoleNoKeyChromium: without API keys the console finds
// that the API answers without one and skips the sign-in.
func TestConsoleNoKeyChromium(t *testing.T) {
	rs := startReal(t, t.TempDir(), func(c *app.Config) { c.WorkspaceQuota = "off" })
	if _, _, err := client.New(rs.URL).CreateSession(context.Background(), api.CreateSessionRequest{SessionID: "no-key"}); err != nil {
		t.Fatal(err)
	}
	tb := startBrowser(t)
	defer tb.clean()
	tb.run("open the console", chromedp.Navigate(rs.URL+"/ui"))
	tb.wait("the sessions, without signing in", `document.querySelector('#sessions tr[data-session="no-key"]')`)
	state := eval[[]any](tb, `[document.querySelector('#signout').checkVisibility(), document.querySelector('#who').textContent, location.pathname]`)
	if fmt.Sprint(state) != "[false no-key mode (loopback) /ui/]" {
		t.Errorf("sign-out hidden, who, path: %v", state)
	}
	// Without keys /metrics is open, and the Pools page reads it.
	tb.wait("the pools link (/metrics answers)", `document.querySelector('#nav-pools').checkVisibility()`)
	tb.run("pools", chromedp.Click(chromedp.CSS("#nav-pools")))
	tb.wait("the pools page", `document.querySelector('#pools-body')?.textContent.includes('No warm pools')`)
}
