package executor

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// zygoteScript is the Python side; see the protocol in its docstring.
// workerScript is its other half, what a forked worker runs; runnerScript
// is what runs user code in a worker. zygote.py loads both from beside
// itself.
var (
	//go:embed zygote.py
	zygoteScript []byte
	//go:embed worker.py
	workerScript []byte
	//go:embed runner.py
	runnerScript []byte
)

// Spawn kinds.
const (
	kindRun     = "run"
	kindContext = "context"
)

// errZygoteDied is the cause given to executions whose zygote died.
var errZygoteDied = errors.New("the Python zygote died")

// zygote is one running zygote process and the executor's end of its
// control socket.
type zygote struct {
	pid  int         // the shim's, which stands for the zygote
	proc *os.Process // the shim: killing it kills the zygote
	// sharedPIDNS: the zygote's pids are the executor's (the shim says so).
	// Otherwise the zygote and its workers are in a PID namespace of their
	// own, whose init kills them all when the zygote dies.
	sharedPIDNS bool
	conn        *net.UnixConn
	log         logger
	rp          *reaper

	ready chan struct{} // closed by the ready message
	info  zygoteReady   // set before ready is closed

	dead     chan struct{} // closed once the zygote's exit was reaped
	deadOnce sync.Once
	status   unix.WaitStatus // set before dead is closed

	// hardKill is kill's SIGKILL to come (a timer, not a goroutine that
	// would wait for a death no reaper may report); die stops it.
	hardKill atomic.Pointer[time.Timer]

	mu       sync.Mutex
	nextTag  uint64
	pending  map[uint64]chan spawnReply
	children map[int]*child
	idle     []idleWorker // pre-forked run workers, oldest first (see handoff.go)

	onChildExit func() // see startZygote
}

// logger is the slice of slog the zygote glue needs.
type logger interface {
	Debug(msg string, args ...any)
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

// zygoteMsg is any message from the zygote.
type zygoteMsg struct {
	Op string `json:"op"`
	// ready
	Preloaded []string          `json:"preloaded"`
	Errors    map[string]string `json:"errors"`
	Python    string            `json:"python"`
	// spawned, spawn_failed
	Tag   uint64 `json:"tag"`
	Error string `json:"error"`
	// spawned, exit
	Pid    int `json:"pid"`
	Status int `json:"status"`
	// log
	Level string `json:"level"`
	Msg   string `json:"msg"`
}

type zygoteReady struct {
	preloaded []string
	errors    map[string]string
	python    string
}

type spawnReply struct {
	child *child
	err   error
}

// child is a process the zygote forked: an execution or a context.
type child struct {
	pid         int           // in the zygote's PID namespace
	sharedPIDNS bool          // which is ours: pid may be signalled
	exited      chan struct{} // closed once status is known or the zygote died
	// Set before exited is closed:
	status unix.WaitStatus
	lost   bool // the zygote died before reporting the exit

	mu    sync.Mutex
	pidfd int // -1 if the kernel gave none; closed once exited
	gone  bool
}

// kill sends SIGKILL to the child, which as PID 1 of its namespace takes
// every process of the execution with it. A pidfd makes this immune to pid
// reuse; without one the pid cannot be reused before the zygote reaps it,
// and the reap is what marks the child gone.
func (c *child) kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return
	}
	if c.pidfd >= 0 {
		if err := unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0); err == nil || errors.Is(err, unix.ESRCH) {
			return
		}
	}
	if c.sharedPIDNS {
		_ = unix.Kill(c.pid, unix.SIGKILL)
	}
}

func (c *child) markGone(ws unix.WaitStatus, lost bool) {
	c.mu.Lock()
	if c.gone {
		c.mu.Unlock()
		return
	}
	c.gone = true
	if c.pidfd >= 0 {
		unix.Close(c.pidfd)
		c.pidfd = -1
	}
	c.status, c.lost = ws, lost
	c.mu.Unlock()
	close(c.exited)
}

// zygoteConfig is handed to the script as its first argument.
type zygoteConfig struct {
	UID            int      `json:"uid"`
	GID            int      `json:"gid"`
	Preload        []string `json:"preload"`
	Bash           string   `json:"bash"`
	Workspace      string   `json:"workspace"`
	ViewDir        string   `json:"view_dir"`
	SeccompFile    string   `json:"seccomp_file"`
	RequireSeccomp bool     `json:"require_seccomp"`
	MaxReturnBytes int      `json:"max_return_bytes"`
	Warm           int      `json:"warm"`
	// Set by the shim (shim.go): the runtime's masks under /proc, which
	// each worker puts back on its own /proc, and how the zygote gets the
	// user namespace its workers run in ("join": setns the descriptor
	// UsernsFD; "self": unshare one).
	ProcOvermounts []procOvermount `json:"proc_overmounts"`
	Userns         string          `json:"userns"`
	UsernsFD       int             `json:"userns_fd"`
	// Unprivileged: the executor's unprivileged mode (Config.Unprivileged).
	// The shim then hands the scripts and the filter over as descriptors
	// (Files: name -> path under /proc/self/fd), the control directory
	// being out of the zygote's reach.
	Unprivileged bool              `json:"unprivileged"`
	Files        map[string]string `json:"files,omitempty"`
}

// startZygote starts python on the script at scriptPath through the shim
// (shim.go), this binary re-executed, which gives it what it needs and no
// capability. onDeath runs once the zygote's exit has been reaped.
//
// onChildExit, if not nil, runs (on the zygote's reading goroutine; it
// must not block) whenever a child's exit is reported and once the zygote
// died.
func startZygote(python, scriptPath string, cfg zygoteConfig, env []string, rp *reaper, log logger, onDeath func(*zygote), onChildExit func()) (*zygote, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("zygote socketpair: %w", err)
	}
	ours := os.NewFile(uintptr(fds[0]), "zygote-ctl")
	theirs := os.NewFile(uintptr(fds[1]), "zygote-ctl-child")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("zygote socket: %w", err)
	}
	conn := fc.(*net.UnixConn)

	devnull, err := os.Open(os.DevNull)
	if err != nil {
		conn.Close()
		return nil, err
	}
	defer devnull.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		conn.Close()
		return nil, err
	}
	defer statusR.Close()
	defer statusW.Close()
	dir := filepath.Dir(scriptPath)
	copyFiles := []string{filepath.Base(scriptPath), "worker.py", "runner.py"}
	if cfg.SeccompFile != "" {
		if filepath.Dir(cfg.SeccompFile) != dir {
			conn.Close()
			return nil, fmt.Errorf("zygote: the seccomp filter %s is not in %s", cfg.SeccompFile, dir)
		}
		copyFiles = append(copyFiles, filepath.Base(cfg.SeccompFile))
	}
	shimJSON, _ := json.Marshal(shimConfig{Python: python, Script: scriptPath, ControlDir: dir, Copy: copyFiles, Zygote: cfg})
	z := &zygote{
		conn:        conn,
		log:         log,
		rp:          rp,
		ready:       make(chan struct{}),
		dead:        make(chan struct{}),
		pending:     make(map[uint64]chan spawnReply),
		children:    make(map[int]*child),
		onChildExit: onChildExit,
	}
	pid, err := rp.start(func() (int, error) {
		p, err := os.StartProcess("/proc/self/exe", []string{selfPath(), shimMode, string(shimJSON)}, &os.ProcAttr{
			Env: env,
			Dir: "/",
			// stdout is not ours to use; stderr is the executor's log, for
			// what Python prints when it crashes.
			Files: []*os.File{devnull, devnull, os.Stderr, theirs, statusW},
			// No Pdeathsig: it fires when the forking *thread* exits, which
			// the Go runtime may do at any time. The zygote exits when its
			// control socket closes instead, which happens when we die.
		})
		if err != nil {
			return 0, err
		}
		z.proc = p
		return p.Pid, nil
	}, func(ws unix.WaitStatus) { z.die(ws, onDeath) })
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("start zygote %s: %w", python, err)
	}
	z.pid = pid
	statusW.Close()
	// The shim reports once the zygote runs, or exits: its word, not the
	// zygote's, says whether the zygote's pids are ours.
	line, _ := bufio.NewReader(io.LimitReader(statusR, 4096)).ReadBytes('\n')
	var st shimStatus
	if err := json.Unmarshal(line, &st); err != nil || st.Error != "" {
		// The shim exits (the reaper reaps it) after saying why, here or
		// on stderr if it could not get that far.
		z.kill()
		why := st.Error
		if why == "" {
			why = "it failed (see the executor's log)"
		}
		return nil, fmt.Errorf("start zygote %s: %.1024s", python, why)
	}
	z.sharedPIDNS = st.SharedPIDNS
	go z.readLoop()
	return z, nil
}

// readLoop dispatches the zygote's messages until its socket closes.
func (z *zygote) readLoop() {
	buf := make([]byte, 1<<16)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := z.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
				z.log.Warn("zygote control socket", "err", err)
			}
			// The socket closes as the zygote exits (or, if it closed it
			// and lives on, it is broken): make sure the exit comes, but let
			// a zygote on its way out report its own status first.
			t := time.NewTimer(time.Second)
			select {
			case <-z.dead:
			case <-t.C:
				z.kill()
			}
			t.Stop()
			return
		}
		var fds []int
		if oobn > 0 {
			fds = parseRights(oob[:oobn])
		}
		var m zygoteMsg
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			z.log.Error("zygote sent a bad message", "err", err)
			closeAll(fds)
			continue
		}
		z.handle(&m, fds)
	}
}

func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func (z *zygote) handle(m *zygoteMsg, fds []int) {
	switch m.Op {
	case "ready":
		z.info = zygoteReady{preloaded: m.Preloaded, errors: m.Errors, python: m.Python}
		close(z.ready)
		z.log.Info("zygote ready", "pid", z.pid, "python", m.Python, "preloaded", m.Preloaded, "preload_errors", m.Errors)
	case "spawned":
		c := &child{pid: m.Pid, sharedPIDNS: z.sharedPIDNS, pidfd: -1, exited: make(chan struct{})}
		if len(fds) > 0 {
			c.pidfd = fds[0]
			closeAll(fds[1:])
		}
		z.mu.Lock()
		z.children[m.Pid] = c
		ch, ok := z.pending[m.Tag]
		delete(z.pending, m.Tag)
		z.mu.Unlock()
		if !ok {
			// Its requester gave up waiting: nobody will use it.
			c.kill()
			return
		}
		ch <- spawnReply{child: c}
	case "worker":
		// A pre-forked run worker: its channel, then its pidfd.
		if len(fds) == 0 {
			z.log.Error("zygote sent a worker without its channel", "pid", m.Pid)
			return
		}
		c := &child{pid: m.Pid, sharedPIDNS: z.sharedPIDNS, pidfd: -1, exited: make(chan struct{})}
		if len(fds) > 1 {
			c.pidfd = fds[1]
			closeAll(fds[2:])
		}
		z.mu.Lock()
		z.children[m.Pid] = c
		z.idle = append(z.idle, idleWorker{c: c, ch: fds[0]})
		z.mu.Unlock()
	case "spawn_failed":
		closeAll(fds)
		z.mu.Lock()
		ch, ok := z.pending[m.Tag]
		delete(z.pending, m.Tag)
		z.mu.Unlock()
		if ok {
			ch <- spawnReply{err: fmt.Errorf("zygote cannot fork: %s: %w", m.Error, errdefs.ErrUnavailable)}
		}
	case "exit":
		closeAll(fds)
		z.mu.Lock()
		c := z.children[m.Pid]
		delete(z.children, m.Pid)
		z.dropIdleLocked(m.Pid) // it died before it had a run
		z.mu.Unlock()
		if c != nil {
			c.markGone(unix.WaitStatus(m.Status), false)
		}
		if z.onChildExit != nil {
			z.onChildExit()
		}
	case "log":
		closeAll(fds)
		switch m.Level {
		case "error":
			z.log.Error("zygote: " + m.Msg)
		case "warn":
			z.log.Warn("zygote: " + m.Msg)
		default:
			z.log.Info("zygote: " + m.Msg)
		}
	default:
		closeAll(fds)
		z.log.Warn("zygote sent an unknown message", "op", m.Op)
	}
}

// spawn asks the zygote to fork a child of kind for f, handing it fds
// (which the caller still owns and must close).
func (z *zygote) spawn(ctx context.Context, kind string, f runFor, fds []int) (*child, error) {
	ch := make(chan spawnReply, 1)
	z.mu.Lock()
	z.nextTag++
	tag := z.nextTag
	z.pending[tag] = ch
	z.mu.Unlock()
	msg, _ := json.Marshal(f.fields(map[string]any{"op": "spawn", "tag": tag, "kind": kind}))
	if _, _, err := z.conn.WriteMsgUnix(msg, unix.UnixRights(fds...), nil); err != nil {
		z.mu.Lock()
		delete(z.pending, tag)
		z.mu.Unlock()
		return nil, fmt.Errorf("%w: %v", errZygoteDied, err)
	}
	// The request may wait in the socket while the zygote is still
	// importing its preload list: bound that, as readyZygote would have.
	t := time.NewTimer(zygoteWaitMax)
	defer t.Stop()
	select {
	case r := <-ch:
		return r.child, r.err
	case <-z.dead:
		return nil, errZygoteDied
	case <-t.C:
		z.mu.Lock()
		_, still := z.pending[tag]
		delete(z.pending, tag)
		z.mu.Unlock()
		if !still { // the reply raced with the timer: it is in ch
			r := <-ch
			return r.child, r.err
		}
		return nil, fmt.Errorf("no Python zygote ready after %s: %w", zygoteWaitMax, errdefs.ErrUnavailable)
	case <-ctx.Done():
		z.mu.Lock()
		_, still := z.pending[tag]
		delete(z.pending, tag)
		z.mu.Unlock()
		if !still {
			// The reply raced with us: it is in ch.
			if r := <-ch; r.child != nil {
				r.child.kill()
			}
		}
		return nil, context.Cause(ctx)
	}
}

// kill stops the zygote by stopping the shim, which kills it, and on
// Linux its PID namespace with it. Children in the executor's PID
// namespace (gVisor) are not killed by that; die does it.
func (z *zygote) kill() {
	if z.proc == nil {
		return
	}
	// SIGTERM lets the shim kill the zygote, reap it and end the holder
	// of its namespaces before it exits; SIGKILL does it the hard way,
	// leaving the holder for the reaper, if the shim is somehow stuck.
	_ = z.proc.Signal(unix.SIGTERM)
	t := time.AfterFunc(5*time.Second, func() {
		select {
		case <-z.dead:
		default:
			_ = z.proc.Signal(os.Kill)
		}
	})
	if !z.hardKill.CompareAndSwap(nil, t) {
		t.Stop() // one is on its way already
	}
}

// die runs when the zygote's exit was reaped: its children have been
// reparented to the executor by then; they are killed (an execution
// without its zygote cannot report its exit) and reaped by the reaper.
func (z *zygote) die(ws unix.WaitStatus, onDeath func(*zygote)) {
	z.deadOnce.Do(func() {
		z.status = ws
		z.conn.Close()
		z.mu.Lock()
		children := z.children
		z.children = map[int]*child{}
		for _, w := range z.idle {
			unix.Close(w.ch)
		}
		z.idle = nil
		z.mu.Unlock()
		close(z.dead)
		if t := z.hardKill.Load(); t != nil {
			t.Stop()
		}
		for _, c := range children {
			c.kill()
			c.markGone(0, true)
			if z.sharedPIDNS {
				// Reparented to us; otherwise they die and are reaped
				// with their PID namespace.
				z.rp.adopt(c.pid)
			}
		}
		if z.onChildExit != nil {
			z.onChildExit()
		}
		if onDeath != nil {
			onDeath(z)
		}
	})
}

// isReady reports whether the zygote finished its preload and still runs.
func (z *zygote) isReady() bool {
	select {
	case <-z.ready:
		return !z.isDead()
	default:
		return false
	}
}

// isDead reports whether the zygote's exit was reaped.
func (z *zygote) isDead() bool {
	select {
	case <-z.dead:
		return true
	default:
		return false
	}
}

// describeExit says how a process ended, for messages.
func describeExit(ws unix.WaitStatus) string {
	switch {
	case ws.Signaled():
		return fmt.Sprintf("killed by signal %d (%s)", ws.Signal(), unix.SignalName(ws.Signal()))
	case ws.Exited():
		return fmt.Sprintf("exited with code %d", ws.ExitStatus())
	default:
		return fmt.Sprintf("ended with wait status %#x", int(ws))
	}
}
