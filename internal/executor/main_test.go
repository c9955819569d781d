package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// testPython is the host's Debian interpreter: /root/.pyenv may come first
// on PATH, and the zygote needs the system one.
const testPython = "/usr/bin/python3"

// childEnv makes the test binary run an executor instead of the tests (see
// TestOutOfMemory, which needs one inside a memory cgroup).
const childEnv = "SBX_EXECUTOR_TEST_CHILD"

func TestMain(m *testing.M) {
	// The executor starts its zygote through this binary, re-executed.
	RunHelper()
	if cfg := os.Getenv(childEnv); cfg != "" {
		os.Exit(runChildExecutor(cfg))
	}
	// testenv's process-wide sandbox environment (the integration tests'
	// executor binary and state directories) goes with the tests.
	code := testenv.WithCleanup(m).Run()
	stopShared()
	if code == 0 {
		// os/signal's loop goroutine lives as long as the process once any
		// signal is watched; it is not ours to stop.
		if err := goleak.Find(goleak.IgnoreAnyFunction("os/signal.loop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// runChildExecutor serves until SIGTERM, like cmd/sbx-executor.
func runChildExecutor(cfgJSON string) int {
	var cfg Config
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	srv, err := New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// requireRoot skips tests that need root (setuid, namespaces) and the
// host's python3.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the executor drops to uid 1000 and creates PID namespaces")
	}
	if _, err := os.Stat(testPython); err != nil {
		t.Skipf("needs %s: %v", testPython, err)
	}
}

// testEnv is one executor served in-process on a socket in a temp dir.
type testEnv struct {
	srv    *Server
	client *client.Client
	ws     string
	sock   string
	logs   *syncBuffer
	cancel context.CancelFunc
	errc   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// newWorkspace makes a workspace the sandbox user owns, under /tmp so that
// uid 1000 can reach it (t.TempDir's parents are root-only).
func newWorkspace(t testing.TB) string {
	t.Helper()
	ws, err := os.MkdirTemp("/tmp", "sbx-ws-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	return ws
}

func testConfig(t testing.TB) Config {
	t.Helper()
	requireRoot(t)
	filter, err := seccomp.InnerFilter()
	if err != nil {
		t.Fatalf("seccomp.InnerFilter: %v", err)
	}
	ctl, err := os.MkdirTemp("", "sbx-ctl-")
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		SocketPath:    filepath.Join(ctl, "executor.sock"),
		Workspace:     newWorkspace(t),
		Python:        testPython,
		SeccompFilter: filter,
		Env:           []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "SBX_BASE=base"},
	}
}

// startServer runs an executor until stop is called.
func startServer(t testing.TB, cfg Config) *testEnv {
	t.Helper()
	requireRoot(t)
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	env := &testEnv{srv: srv, ws: cfg.Workspace, sock: cfg.SocketPath, logs: logs, cancel: cancel, errc: make(chan error, 1)}
	go func() { env.errc <- srv.Serve(ctx) }()
	env.client = client.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", cfg.SocketPath)
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer wcancel()
	if err := env.client.WaitReady(wctx); err != nil {
		env.stop()
		t.Fatalf("executor not ready: %v\nlogs:\n%s", err, logs.String())
	}
	return env
}

func (e *testEnv) stop() {
	e.client.Close()
	e.cancel()
	<-e.errc
	os.RemoveAll(e.ws)
	os.RemoveAll(filepath.Dir(e.sock))
}

var shared struct {
	once sync.Once
	env  *testEnv
}

// sharedEnv is one executor for the tests that do not hurt it. If it fails
// to start, the test that started it fails with the reason and the others
// fail at once.
func sharedEnv(t testing.TB) *testEnv {
	t.Helper()
	requireRoot(t)
	shared.once.Do(func() { shared.env = startServer(t, testConfig(t)) })
	if shared.env == nil {
		t.Fatal("the shared executor failed to start (see the first test that used it)")
	}
	return shared.env
}

func stopShared() {
	if shared.env != nil {
		shared.env.stop()
	}
}

// run executes req with a generous client-side deadline.
func (e *testEnv) run(t testing.TB, req wire.RunRequest) *wire.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := e.client.Run(ctx, req, nil)
	if err != nil {
		t.Fatalf("run: %v\nexecutor logs:\n%s", err, tail(e.logs.String(), 4000))
	}
	return res
}

func py(code string) wire.RunRequest {
	return wire.RunRequest{Language: wire.LanguagePython, Code: code}
}
func sh(code string) wire.RunRequest { return wire.RunRequest{Language: wire.LanguageBash, Code: code} }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// processesWith lists the pids whose command line contains marker.
func processesWith(marker string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(marker)) {
			pids = append(pids, e.Name()+":"+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return pids
}

// waitFor polls cond (the executor's work is asynchronous) for up to a
// minute; it is not a timing assertion, only a bound on a hang.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
