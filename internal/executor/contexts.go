package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// contextKey names a context: its id within its conversation ("" for
// none). The same id in two conversations names two contexts, so that a
// context never outlives, or crosses, the conversation whose view of the
// uploads it was started with.
type contextKey struct {
	conversation, id string
}

// pyContext is a stateful interpreter: a long-lived child of the zygote
// (same namespace, privilege and seccomp set-up as any execution) that keeps
// one module's globals across runs. The executor talks to it over its own
// seqpacket socket: {"op":"run"} with the payload, stdout, stderr and result
// descriptors attached; the process dup2s them for the run and lets go of
// them before it writes the result. Its conversation's view of the uploads
// is made once, when the process starts (the spawn request carries the
// conversation), and holds for the process's life.
type pyContext struct {
	s   *Server
	key contextKey
	// sem serializes runs: one token, held for a whole run.
	sem chan struct{}

	mu      sync.Mutex
	proc    *child // nil until started, or after it died
	ctl     *net.UnixConn
	deleted bool
	current *execution // the run holding sem, for delete
}

func newPyContext(s *Server, key contextKey) *pyContext {
	return &pyContext{s: s, key: key, sem: make(chan struct{}, 1)}
}

// run executes e in the context, starting the process if it is not alive.
func (pc *pyContext) run(e *execution) outcome {
	select {
	case pc.sem <- struct{}{}:
	case <-e.ctx.Done():
		return outcome{cause: context.Cause(e.ctx)}
	}
	defer func() { <-pc.sem }()
	e.begin()
	pc.mu.Lock()
	if pc.deleted {
		pc.mu.Unlock()
		return outcome{cause: errContextDeleted}
	}
	pc.current = e
	proc, ctl := pc.proc, pc.ctl
	pc.mu.Unlock()
	defer func() {
		pc.mu.Lock()
		pc.current = nil
		pc.mu.Unlock()
	}()

	if proc == nil || isClosed(proc.exited) {
		if proc != nil {
			pc.kill(proc) // forget the dead one, and close its channel
		}
		var err error
		if proc, ctl, err = pc.start(e.ctx, e.group); err != nil {
			return startFailure(e.ctx, err)
		}
	}

	p, err := newPipes()
	if err != nil {
		return outcome{startErr: err}
	}
	pfd, err := e.payloadFD()
	if err != nil {
		p.closeAll()
		return outcome{startErr: err}
	}
	rd := e.startReaders(p)
	msg := []byte(`{"op":"run"}`)
	_, _, err = ctl.WriteMsgUnix(msg, unix.UnixRights(pfd, p.w[0], p.w[1], p.w[2]), nil)
	unix.Close(pfd)
	p.closeWrite()
	if err != nil {
		// The process is dying or dead; the exit will say how.
		pc.kill(proc)
		<-proc.exited
		rd.finish(0)
		return outcome{contextDied: true, stateLost: true, exited: !proc.lost, ws: proc.status, lost: proc.lost}
	}

	// The run is over when the result pipe closes; the process dying ends
	// it too.
	done := make(chan struct{})
	var died bool
	go func() {
		select {
		case <-rd.resultDone:
		case <-proc.exited:
			died = true
		}
		close(done)
	}()
	var o outcome
	o.timedOut, o.cause = e.waitOrKill(done, func() { pc.kill(proc) })
	if died || o.timedOut || o.cause != nil {
		// The process is gone or going; its exit closes every pipe it held.
		pc.kill(proc)
		<-proc.exited
		o.contextDied, o.stateLost = died, true
		o.exited, o.ws, o.lost = !proc.lost, proc.status, proc.lost
		rd.finish(exitGrace)
	} else {
		rd.finish(contextGrace)
	}
	o.result = rd.result
	if died && !o.timedOut && o.cause == nil && len(o.result) > 0 {
		// It finished the run and died right after (os._exit in a thread,
		// say): the run's result stands, only the state is gone.
		o.contextDied, o.exited = false, false
	}
	return o
}

// start forks the context process and waits for its hello.
func (pc *pyContext) start(ctx context.Context, group int) (*child, *net.UnixConn, error) {
	z, err := pc.s.readyZygote(ctx)
	if err != nil {
		return nil, nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("context socketpair: %w", err)
	}
	proc, err := z.spawn(ctx, kindContext, runFor{pc.key.conversation, group}, []int{fds[1]})
	unix.Close(fds[1])
	if err != nil {
		unix.Close(fds[0])
		return nil, nil, err
	}
	f := os.NewFile(uintptr(fds[0]), "context-ctl")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		proc.kill()
		return nil, nil, err
	}
	ctl := fc.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { ctl.SetReadDeadline(time.Now()) })
	defer stop()
	_ = ctl.SetReadDeadline(time.Now().Add(zygoteWaitMax))
	buf := make([]byte, 4096)
	n, err := ctl.Read(buf)
	_ = ctl.SetReadDeadline(time.Time{})
	var hello struct{ Op, Error string }
	if err == nil {
		err = json.Unmarshal(buf[:n], &hello)
	}
	if err == nil && hello.Op != "ready" {
		err = fmt.Errorf("%s: %w", hello.Error, errdefs.ErrUnavailable)
	}
	if err != nil || n == 0 {
		proc.kill()
		ctl.Close()
		if err == nil {
			err = fmt.Errorf("context process exited during start-up: %w", errdefs.ErrUnavailable)
		}
		return nil, nil, fmt.Errorf("start context %q%s: %w", pc.key.id, pc.key.of(), err)
	}
	pc.mu.Lock()
	pc.proc, pc.ctl = proc, ctl
	deleted := pc.deleted
	pc.mu.Unlock()
	if deleted {
		pc.kill(proc)
		return nil, nil, errContextDeleted
	}
	pc.s.log.Info("context started", "context", pc.key.id, "conversation", pc.key.conversation, "pid", proc.pid)
	return proc, ctl, nil
}

// kill kills the context's process (if it is still proc) and forgets it,
// so that the next run starts a fresh one.
func (pc *pyContext) kill(proc *child) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	proc.kill()
	if pc.proc == proc {
		pc.ctl.Close()
		pc.proc, pc.ctl = nil, nil
	}
}

// delete kills the context for good: its running run is cancelled and
// queued runs find it deleted.
func (pc *pyContext) delete() {
	pc.mu.Lock()
	pc.deleted = true
	cur, proc := pc.current, pc.proc
	pc.mu.Unlock()
	if cur != nil {
		cur.cancel(errContextDeleted)
	}
	if proc != nil {
		pc.kill(proc)
	}
}

// destroy releases the context at shutdown.
func (pc *pyContext) destroy() { pc.delete() }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// of is " of conversation C" for messages, or nothing.
func (k contextKey) of() string {
	if k.conversation == "" {
		return ""
	}
	return fmt.Sprintf(" of conversation %q", k.conversation)
}
