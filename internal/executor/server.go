// Package executor is the daemon that runs inside every sandbox as PID 1.
//
// It serves HTTP/1.1 over a unix socket (PROTOCOL.md is the contract; the
// wire format is package wire, the control plane's client package client).
// Code runs in children of a Python "zygote" that has already imported the
// template's heavy modules: each execution is a fork of it, PID 1 of a
// fresh PID namespace, with every privilege dropped and the inner seccomp
// filter installed, so that killing that one process kills everything the
// execution started.
package executor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Version is the executor's version, reported by /health. Release builds
// set it with -ldflags "-X github.com/sbx-sandbox/sbx/internal/executor.Version=...".
var Version = "dev"

// Config configures the executor. Zero fields take the documented defaults.
type Config struct {
	// SocketPath is where the HTTP API listens. Default /run/sbx/executor.sock.
	// Unused when Listener is set.
	SocketPath string
	// Listener, if set, is a network listener (a pod's IP) to serve the
	// API on instead of the socket. Anything on the network can connect
	// to it, so Auth is then required: every connection must open with
	// the control plane's token (package token) or is closed unanswered.
	Listener net.Listener `json:"-"`
	// Auth checks the tokens of connections to Listener.
	Auth *token.Verifier `json:"-"`
	// ControlDir holds the socket, the zygote script and the inner seccomp
	// filter; it is made mode 0700 so that only root may enter it.
	// Default: the directory of SocketPath.
	ControlDir string
	// Workspace is the session's files and the default cwd. Default /workspace.
	Workspace string
	// UID and GID are what user code runs as. Zero means the default,
	// 1000: user code never runs as root. Negative values are refused.
	UID, GID int
	// Preload lists Python modules the zygote imports before it is ready.
	Preload []string
	// Python is the interpreter of the zygote. Default /usr/bin/python3.
	Python string
	// Bash runs bash executions. Default /bin/bash.
	Bash string
	// SeccompFilter is the inner seccomp program (seccomp.InnerFilter) that
	// every user process installs. Required unless AllowNoSeccomp.
	SeccompFilter []byte
	// AllowNoSeccomp lets user code run without an inner filter. For tests
	// on a host only; production never sets it.
	AllowNoSeccomp bool
	// Env is the environment of the executor's helpers (the zygote) and the
	// base of every execution's. Default os.Environ() without what the
	// kubelet adds to every container (hostEnv). It must hold nothing
	// a tenant chose: the zygote runs as the sandbox's root (LD_PRELOAD
	// there would run the tenant's code with the executor's capabilities).
	Env []string
	// UserEnv is added to every execution's environment, and only there:
	// user code gets it after it has dropped its privileges. Template and
	// session variables go here.
	UserEnv map[string]string
	// CgroupRoot is where cgroups are mounted. Default /sys/fs/cgroup.
	CgroupRoot string
	// MaxContexts bounds the stateful contexts of the sandbox. Default 16.
	MaxContexts int
	// WarmWorkers is how many run workers the zygote keeps forked and set
	// up ahead of demand; each costs the memory its set-up and warm-up
	// touched (2 MB for the python template, 7 MB with pandas). Default 1:
	// a second one costs that memory again and only helps bursts of
	// concurrent runs (a burst beyond the pool forks on demand). Negative
	// means none.
	WarmWorkers int
	// Logger receives the executor's logs. Default: slog JSON on stderr.
	Logger *slog.Logger
	// Unprivileged runs the executor without the privileges it has under
	// runc (no CAP_SYS_ADMIN, no user namespace of its own, a seccomp
	// profile that refuses namespaces and mounts): as in a Kubernetes Pod
	// whose container has only CHOWN, DAC_OVERRIDE, FOWNER, SETUID, SETGID,
	// SETPCAP and KILL. The shim then makes no namespace and covers
	// nothing; executions share the sandbox's PID and mount namespaces
	// (unprivileged.go says what holds). Set explicitly, never guessed:
	// the other mode fails closed where this one would quietly hold less.
	Unprivileged bool
}

func (c *Config) setDefaults() error {
	if c.SocketPath == "" {
		c.SocketPath = "/run/sbx/executor.sock"
	}
	if c.Listener != nil && c.Auth == nil {
		return fmt.Errorf("executor: a network listener needs a token verifier: never an anonymous API on a network: %w", errdefs.ErrInvalidArgument)
	}
	if c.ControlDir == "" {
		c.ControlDir = filepath.Dir(c.SocketPath)
	}
	if c.Workspace == "" {
		c.Workspace = "/workspace"
	}
	if c.UID == 0 {
		c.UID = 1000
	}
	if c.GID == 0 {
		c.GID = 1000
	}
	if c.UID < 0 || c.GID < 0 {
		return fmt.Errorf("executor: uid %d gid %d: user code never runs as root: %w", c.UID, c.GID, errdefs.ErrInvalidArgument)
	}
	if c.Python == "" {
		c.Python = "/usr/bin/python3"
	}
	if c.Bash == "" {
		c.Bash = "/bin/bash"
	}
	if c.Env == nil {
		c.Env = hostEnv(os.Environ())
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/sys/fs/cgroup"
	}
	if c.MaxContexts == 0 {
		c.MaxContexts = 16
	}
	if c.WarmWorkers == 0 {
		c.WarmWorkers = 1
	}
	c.WarmWorkers = max(c.WarmWorkers, 0)
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	if len(c.SeccompFilter) == 0 && !c.AllowNoSeccomp && c.Unprivileged {
		// The node's profile is not sbx's: the inner filter carries it.
		f, err := seccomp.UnprivilegedInnerFilter()
		if err != nil {
			return fmt.Errorf("executor: inner seccomp filter: %w", err)
		}
		c.SeccompFilter = f
	}
	if len(c.SeccompFilter) == 0 && !c.AllowNoSeccomp {
		return fmt.Errorf("executor: no inner seccomp filter: %w", errdefs.ErrInvalidArgument)
	}
	for _, m := range c.Preload {
		if m == "" || strings.ContainsAny(m, " \t\n/") {
			return fmt.Errorf("executor: preload module %q: %w", m, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// hostEnv is env without the variables the kubelet puts in every
// container, whatever the Pod says (enableServiceLinks: false keeps the
// other Services' out, not the API server's): KUBERNETES_SERVICE_HOST and
// its kin tell sandboxed code where the cluster's API server is. The
// NetworkPolicy keeps it from reaching it; this keeps it from being told.
func hostEnv(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, "KUBERNETES_") {
			out = append(out, kv)
		}
	}
	return out
}

// Server is the executor daemon.
type Server struct {
	cfg        Config
	log        *slog.Logger
	started    time.Time
	scriptPath string
	filterPath string
	viewDir    string // where workers assemble a conversation's view (worker.py)
	env        map[string]string
	cg         *cgroupReader

	rp         *reaper
	baseCtx    context.Context
	baseCancel context.CancelCauseFunc
	wg         sync.WaitGroup // execution supervisors and the zygote supervisor

	mu         sync.Mutex
	closing    bool
	execs      map[string]*execution
	contexts   map[contextKey]*pyContext
	zyg        *zygote       // nil while none is running
	zygChanged chan struct{} // closed and replaced whenever zyg changes
	zygErr     error         // why the last zygote died or failed to start

	ws *workspace.Local // the file routes' workspace, opened on first use
	// workspaceBytes is the disk the workspace's files took at the last
	// walk (every execution's start and end): /stats's workspace_bytes.
	workspaceBytes atomic.Int64

	// The unprivileged mode's conversation views (podviews.go); nil in
	// the other mode, whose workers make theirs with mounts.
	views *podViews

	// The unprivileged mode's sweeps of ended executions' processes
	// (unprivileged.go): one at a time; sweepKick asks for one.
	sweepMu   sync.Mutex
	sweepKick chan struct{}
}

var errShuttingDown = errors.New("the executor is shutting down")

// New checks cfg and prepares the control directory. Serve runs the server.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.ControlDir, 0o700); err != nil {
		return nil, fmt.Errorf("executor: control dir: %w", err)
	}
	// MkdirAll leaves an existing (bind-mounted) directory's mode alone.
	if err := os.Chmod(cfg.ControlDir, 0o700); err != nil {
		return nil, fmt.Errorf("executor: control dir: %w", err)
	}
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger,
		started:    time.Now(),
		scriptPath: filepath.Join(cfg.ControlDir, "zygote.py"),
		viewDir:    filepath.Join(cfg.ControlDir, "view"),
		env:        map[string]string{},
		execs:      map[string]*execution{},
		contexts:   map[contextKey]*pyContext{},
		zygChanged: make(chan struct{}),
		sweepKick:  make(chan struct{}, 1),
	}
	if cfg.Unprivileged {
		s.views = newPodViews(cfg.Workspace)
	}
	if err := os.WriteFile(s.scriptPath, zygoteScript, 0o600); err != nil {
		return nil, fmt.Errorf("executor: write zygote: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.ControlDir, "worker.py"), workerScript, 0o600); err != nil {
		return nil, fmt.Errorf("executor: write worker: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cfg.ControlDir, "runner.py"), runnerScript, 0o600); err != nil {
		return nil, fmt.Errorf("executor: write runner: %w", err)
	}
	// The staging directory of conversation views: each worker mounts a
	// tmpfs on it in its own mount namespace, so one directory serves them
	// all; inside the control directory only root can reach it.
	if err := os.Mkdir(s.viewDir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("executor: view dir: %w", err)
	}
	if fi, err := os.Lstat(s.viewDir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("executor: view dir %s is not a directory (%v)", s.viewDir, err)
	}
	if len(cfg.SeccompFilter) > 0 {
		s.filterPath = filepath.Join(cfg.ControlDir, "inner-seccomp.bpf")
		if err := os.WriteFile(s.filterPath, cfg.SeccompFilter, 0o600); err != nil {
			return nil, fmt.Errorf("executor: write seccomp filter: %w", err)
		}
	}
	for _, kv := range cfg.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			s.env[k] = v
		}
	}
	for k, v := range cfg.UserEnv {
		s.env[k] = v
	}
	self, _ := os.ReadFile("/proc/self/cgroup")
	s.cg = newCgroupReader(cfg.CgroupRoot, self)
	s.baseCtx, s.baseCancel = context.WithCancelCause(context.Background())
	return s, nil
}

// Serve listens on the socket (or Config.Listener) and serves until ctx is done, then kills
// every execution and the zygote and returns. It returns an error only if
// it could not start. A Server serves once.
func (s *Server) Serve(ctx context.Context) error {
	rp, err := newReaper(os.Getpid() == 1, s.log)
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	s.rp = rp
	defer rp.close()

	l, where, err := s.listen()
	if err != nil {
		return err
	}
	if s.cfg.Listener == nil {
		defer os.Remove(s.cfg.SocketPath)
	}

	if s.cfg.Unprivileged {
		if err := s.initWorkspace(); err != nil {
			return fmt.Errorf("executor: the workspace: %w", err)
		}
	}
	s.wg.Add(1)
	go s.superviseZygote()
	if s.cfg.Unprivileged {
		s.wg.Add(1)
		go s.sweeper()
	}

	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		// No write timeout: a run's stream may last its whole timeout.
		IdleTimeout: 5 * time.Minute,
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(l) }()
	s.log.Info("executor listening", where, "version", Version, "pid1", os.Getpid() == 1)

	select {
	case <-ctx.Done():
	case err := <-serveErr:
		s.log.Error("http server stopped", "err", err)
	}
	s.shutdown(hs)
	return nil
}

// listen opens the socket, or wraps the network listener in the token
// check. It returns how to log where it listens.
func (s *Server) listen() (net.Listener, slog.Attr, error) {
	if s.cfg.Listener != nil {
		l, err := token.NewListener(s.cfg.Listener, s.cfg.Auth, token.ListenerOptions{Logger: s.log})
		if err != nil {
			return nil, slog.Attr{}, fmt.Errorf("executor: %w", err)
		}
		return l, slog.Group("tcp", "addr", l.Addr().String(), "sandbox", s.cfg.Auth.SandboxID()), nil
	}
	_ = os.Remove(s.cfg.SocketPath) // a stale socket of a previous run
	l, err := net.Listen("unix", s.cfg.SocketPath)
	if err != nil {
		return nil, slog.Attr{}, fmt.Errorf("executor: listen: %w", err)
	}
	if err := os.Chmod(s.cfg.SocketPath, 0o600); err != nil {
		l.Close()
		return nil, slog.Attr{}, fmt.Errorf("executor: socket mode: %w", err)
	}
	return l, slog.String("socket", s.cfg.SocketPath), nil
}

// shutdown kills everything, lets the handlers write their (cancelled)
// results, and waits for every goroutine it owns.
func (s *Server) shutdown(hs *http.Server) {
	s.mu.Lock()
	s.closing = true
	contexts := make([]*pyContext, 0, len(s.contexts))
	for _, pc := range s.contexts {
		contexts = append(contexts, pc)
	}
	s.mu.Unlock()
	s.baseCancel(errShuttingDown)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		hs.Close()
	}
	s.wg.Wait()
	for _, pc := range contexts {
		pc.destroy()
	}
	s.mu.Lock()
	if s.ws != nil {
		s.ws.Close()
		s.ws = nil
	}
	s.mu.Unlock()
	s.log.Info("executor stopped")
}

// Handler is the HTTP API. Executions run only while Serve runs (it owns
// the zygote); Serve uses this handler itself.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("POST /run", s.handleRun)
	mux.HandleFunc("POST /cancel", s.handleCancel)
	mux.HandleFunc("GET /stats", s.handleStats)
	mux.HandleFunc("DELETE /contexts/{id}", s.handleDeleteContext)
	mux.HandleFunc("DELETE /conversations/{id}", s.handleDeleteConversation)
	mux.Handle("/files/", s.filesHandler())
	// Everything else, in the same error format as the rest.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case p == "/health" || p == "/run" || p == "/cancel" || p == "/stats" ||
			strings.HasPrefix(p, "/contexts/") || strings.HasPrefix(p, "/conversations/"):
			writeErrorStatus(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method+" "+p+" is not supported")
		default:
			writeErrorStatus(w, http.StatusNotFound, "not_found", "no such endpoint: "+p)
		}
	})
	return mux
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	h := wire.Health{OK: true, Version: Version, Preload: append([]string{}, s.cfg.Preload...),
		UptimeMs: time.Since(s.started).Milliseconds()}
	s.mu.Lock()
	z, zerr := s.zyg, s.zygErr
	s.mu.Unlock()
	if z != nil && !z.isDead() {
		select {
		case <-z.ready:
			h.Ready = true
			var errs []string
			for name, e := range z.info.errors {
				errs = append(errs, name+": "+e)
			}
			sort.Strings(errs)
			h.PreloadError = strings.Join(errs, "; ")
		default:
		}
	}
	if !h.Ready && zerr != nil {
		h.PreloadError = "zygote: " + zerr.Error()
	}
	writeJSON(w, http.StatusOK, h)
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	var req wire.CancelRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096))
	if err := dec.Decode(&req); err != nil || req.ID == "" {
		writeError(w, fmt.Errorf("cancel: body must be {\"id\": ...}: %w", errdefs.ErrInvalidArgument))
		return
	}
	s.mu.Lock()
	e := s.execs[req.ID]
	s.mu.Unlock()
	if e != nil {
		e.cancel(errCancelRequested)
	}
	writeJSON(w, http.StatusOK, wire.CancelResponse{Cancelled: e != nil})
}

func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	st := s.cg.read()
	st.WorkspaceBytes = uint64(max(0, s.workspaceBytes.Load()))
	s.mu.Lock()
	st.RunningExecutions = len(s.execs)
	st.Contexts = len(s.contexts)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, st)
}

// handleDeleteContext deletes the context {id} of the conversation
// ?conversation_id= (none if absent).
func (s *Server) handleDeleteContext(w http.ResponseWriter, r *http.Request) {
	key := contextKey{conversation: r.URL.Query().Get("conversation_id"), id: r.PathValue("id")}
	if key.conversation != "" && !wire.ValidConversationID(key.conversation) {
		writeError(w, fmt.Errorf("conversation_id %q is not a valid conversation id: %w", key.conversation, errdefs.ErrInvalidArgument))
		return
	}
	s.mu.Lock()
	pc := s.contexts[key]
	delete(s.contexts, key)
	s.mu.Unlock()
	if pc == nil {
		writeError(w, fmt.Errorf("context %q%s: %w", key.id, key.of(), errdefs.ErrNotFound))
		return
	}
	pc.delete()
	writeJSON(w, http.StatusOK, map[string]bool{"deleted": true})
}

// handleDeleteConversation deletes every context of the conversation {id}
// (the control plane purges a conversation, R-23). Idempotent: a
// conversation without contexts gives 0.
func (s *Server) handleDeleteConversation(w http.ResponseWriter, r *http.Request) {
	conv := r.PathValue("id")
	if !wire.ValidConversationID(conv) {
		writeError(w, fmt.Errorf("conversation %q is not a valid conversation id: %w", conv, errdefs.ErrInvalidArgument))
		return
	}
	var doomed []*pyContext
	s.mu.Lock()
	for key, pc := range s.contexts {
		if key.conversation == conv {
			doomed = append(doomed, pc)
			delete(s.contexts, key)
		}
	}
	s.mu.Unlock()
	for _, pc := range doomed {
		pc.delete()
	}
	writeJSON(w, http.StatusOK, wire.DeleteConversationResponse{DeletedContexts: len(doomed)})
}

// superviseZygote keeps a zygote running, restarting it with backoff when
// it dies, until the server shuts down.
func (s *Server) superviseZygote() {
	defer s.wg.Done()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	cfg := zygoteConfig{
		UID: s.cfg.UID, GID: s.cfg.GID, Preload: append([]string{}, s.cfg.Preload...), Bash: s.cfg.Bash,
		Workspace: s.cfg.Workspace, ViewDir: s.viewDir,
		SeccompFile: s.filterPath, RequireSeccomp: !s.cfg.AllowNoSeccomp, MaxReturnBytes: wire.MaxReturnValueBytes,
		Warm: s.cfg.WarmWorkers, Unprivileged: s.cfg.Unprivileged,
	}
	if s.cfg.Unprivileged {
		// No mount namespace per worker: the conversation views are
		// the executor's (podviews.go).
		cfg.ViewDir = ""
	}
	env := s.cfg.Env
	for {
		died := make(chan struct{})
		var onChildExit func()
		if s.cfg.Unprivileged {
			onChildExit = s.kickSweep
		}
		z, err := startZygote(s.cfg.Python, s.scriptPath, cfg, env, s.rp, s.log, func(*zygote) { close(died) }, onChildExit)
		if err == nil {
			s.setZygote(z, nil)
			up := time.Now()
			select {
			case <-died:
				err = fmt.Errorf("%w (%s)", errZygoteDied, describeExit(z.status))
				s.log.Error("zygote died; restarting it", "pid", z.pid, "how", describeExit(z.status))
				if time.Since(up) > time.Minute {
					backoff = minBackoff
				}
			case <-s.baseCtx.Done():
				z.kill()
				<-died
				s.setZygote(nil, errShuttingDown)
				return
			}
		} else {
			s.log.Error("cannot start the zygote", "err", err)
		}
		s.setZygote(nil, err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-s.baseCtx.Done():
			t.Stop()
			return
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (s *Server) setZygote(z *zygote, err error) {
	s.mu.Lock()
	s.zyg, s.zygErr = z, err
	close(s.zygChanged)
	s.zygChanged = make(chan struct{})
	s.mu.Unlock()
}

// zygoteWaitMax bounds how long an execution waits for a zygote to be
// ready (first start, preload, or restart after a crash) before failing.
const zygoteWaitMax = 60 * time.Second

// readyZygote returns a running zygote that has finished its preload,
// waiting (up to zygoteWaitMax in all) for one if needed.
func (s *Server) readyZygote(ctx context.Context) (*zygote, error) {
	deadline := time.Now().Add(zygoteWaitMax)
	for {
		z, err := s.zygoteBy(ctx, deadline)
		if err != nil {
			return nil, err
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-z.ready:
		case <-z.dead: // zygoteBy waits for its successor
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		if z.isReady() {
			return z, nil
		}
		if err := context.Cause(ctx); err != nil {
			return nil, err
		}
		if !time.Now().Before(deadline) {
			return nil, fmt.Errorf("no Python zygote ready after %s: %w", zygoteWaitMax, errdefs.ErrUnavailable)
		}
	}
}

// liveZygote returns the running zygote, ready or still importing its
// preload list, waiting (up to zygoteWaitMax) while there is none.
func (s *Server) liveZygote(ctx context.Context) (*zygote, error) {
	return s.zygoteBy(ctx, time.Now().Add(zygoteWaitMax))
}

// zygoteBy returns the running zygote, waiting until deadline while there
// is none (first start, or a restart after a crash).
func (s *Server) zygoteBy(ctx context.Context, deadline time.Time) (*zygote, error) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		s.mu.Lock()
		z, changed, zerr := s.zyg, s.zygChanged, s.zygErr
		s.mu.Unlock()
		if z != nil && !z.isDead() {
			return z, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-t.C:
			return nil, fmt.Errorf("no Python zygote ready after %s (last error: %v): %w", zygoteWaitMax, zerr, errdefs.ErrUnavailable)
		}
	}
}

// newID makes an execution id when the request has none.
func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "exec-" + hex.EncodeToString(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError maps an error's category to its HTTP status, once, here.
func writeError(w http.ResponseWriter, err error) {
	status, code := http.StatusInternalServerError, "internal"
	switch {
	case errors.Is(err, errdefs.ErrTooLarge):
		status, code = http.StatusRequestEntityTooLarge, "too_large"
	case errors.Is(err, errdefs.ErrInvalidArgument):
		status, code = http.StatusBadRequest, "invalid_argument"
	case errors.Is(err, errdefs.ErrNotFound):
		status, code = http.StatusNotFound, "not_found"
	case errors.Is(err, errdefs.ErrAlreadyExists):
		status, code = http.StatusConflict, "already_exists"
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		status, code = http.StatusConflict, "failed_precondition"
	case errors.Is(err, errdefs.ErrResourceExhausted):
		status, code = http.StatusTooManyRequests, "resource_exhausted"
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, errShuttingDown):
		status, code = http.StatusServiceUnavailable, "unavailable"
	}
	writeErrorStatus(w, status, code, err.Error())
}

func writeErrorStatus(w http.ResponseWriter, status int, code, msg string) {
	var body wire.ErrorBody
	body.Error.Code, body.Error.Message = code, msg
	writeJSON(w, status, body)
}
