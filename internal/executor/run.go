package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// Causes of an execution's cancellation.
var (
	errCancelRequested = errors.New("cancelled by request")
	errClientGone      = errors.New("the client disconnected before the result")
	errContextDeleted  = errors.New("its context was deleted")
)

// Grace periods for output pipes after the run is over. A stateless run's
// processes are all dead when its exit is reported, so EOF is immediate and
// the grace only guards against a leaked descriptor. A context's
// background processes may keep its pipes open; the run does not wait for
// them.
const (
	exitGrace    = 2 * time.Second
	contextGrace = 200 * time.Millisecond
)

// execution is one /run: its request, its output and its outcome.
type execution struct {
	s      *Server
	id     string
	req    *wire.RunRequest
	pc     *pyContext // nil unless req.ContextID
	out    *capture
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed once res is set
	res    *wire.Result
	// group is the conversation's in the unprivileged mode (enterView).
	group int

	// Set by begin, when the run leaves its queue and starts:
	startedAt time.Time
	before    workspaceSnapshot
	oomBefore uint64
}

// enterView, in the unprivileged mode, waits for the run's turn at the
// uploads view of its conversation (podviews.go); release ends it.
func (e *execution) enterView() (release func(), err error) {
	if e.s.views == nil || e.req.ConversationID == "" {
		return func() {}, nil
	}
	e.group, release, err = e.s.views.enter(e.ctx, e.req.ConversationID, e.timeout())
	return release, err
}

// begin records the state the run's outcome is compared with: the
// workspace's files and the OOM kill count.
func (e *execution) begin() {
	e.startedAt = time.Now().UTC()
	e.before = e.s.snapshotWorkspace()
	e.oomBefore = e.s.cg.oomKills()
}

// startExecution registers req and starts running it. The errors are the
// ones the client gets as an HTTP error instead of a result.
func (s *Server) startExecution(req *wire.RunRequest) (*execution, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, errShuttingDown
	}
	if req.ID == "" {
		req.ID = newID()
	}
	if _, dup := s.execs[req.ID]; dup {
		return nil, fmt.Errorf("execution %q is already running: %w", req.ID, errdefs.ErrAlreadyExists)
	}
	e := &execution{s: s, id: req.ID, req: req, out: newCapture(req.OutputLimitBytes), done: make(chan struct{})}
	if req.ContextID != "" {
		key := contextKey{conversation: req.ConversationID, id: req.ContextID}
		e.pc = s.contexts[key]
		if e.pc == nil {
			if len(s.contexts) >= s.cfg.MaxContexts {
				return nil, fmt.Errorf("context %q%s: the sandbox already has %d contexts, the most it may have; delete one first: %w",
					req.ContextID, key.of(), len(s.contexts), errdefs.ErrResourceExhausted)
			}
			e.pc = newPyContext(s, key)
			s.contexts[key] = e.pc
		}
	}
	e.ctx, e.cancel = context.WithCancelCause(s.baseCtx)
	s.execs[req.ID] = e
	s.wg.Add(1)
	go e.supervise()
	return e, nil
}

// outcome is what happened to the process, before it is judged.
type outcome struct {
	startErr error           // it never ran
	cause    error           // cancelled (request, disconnect, shutdown, ...)
	timedOut bool            // killed at its deadline
	exited   bool            // ws is the exit status
	ws       unix.WaitStatus //
	lost     bool            // the zygote died under it
	result   []byte          // what it wrote on the result pipe
	// contextDied: a context process ended during the run.
	contextDied bool
	// stateLost: a context process was killed or died; its globals are gone.
	stateLost bool
}

func (e *execution) supervise() {
	defer e.s.wg.Done()
	defer e.cancel(nil)
	s := e.s
	var o outcome
	if release, err := e.enterView(); err != nil {
		o = startFailure(e.ctx, err)
	} else {
		if e.pc != nil {
			o = e.pc.run(e)
		} else {
			e.begin()
			o = e.runStateless()
		}
		release()
	}
	res := &wire.Result{ID: e.id, StartedAt: e.startedAt, Artifacts: []string{}}
	if e.startedAt.IsZero() { // it never left the context's queue
		res.StartedAt = time.Now().UTC()
	} else {
		after := s.snapshotWorkspace()
		res.Artifacts, res.ArtifactsTruncated = artifacts(e.before, after)
		res.WorkspaceUnchanged = unchanged(e.before, after)
	}
	res.Stdout, res.StdoutTruncated = e.out.text(streamStdout)
	res.Stderr, res.StderrTruncated = e.out.text(streamStderr)
	e.judge(res, &o, e.oomBefore)
	res.FinishedAt = time.Now().UTC()
	res.DurationMs = res.FinishedAt.Sub(res.StartedAt).Milliseconds()
	s.log.Info("execution finished", "id", e.id, "language", e.req.Language, "context", e.req.ContextID,
		"conversation", e.req.ConversationID,
		"status", res.Status, "exit_code", res.ExitCode, "duration_ms", res.DurationMs)
	s.mu.Lock()
	delete(s.execs, e.id)
	s.mu.Unlock()
	e.res = res
	close(e.done)
}

// pipes are one execution's output and result pipes. The read ends are
// non-blocking (so that closing them interrupts a read); the write ends,
// handed to the child, stay blocking as programs expect of stdout.
type pipes struct {
	r [3]*os.File // stdout, stderr, result
	w [3]int
}

func newPipes() (*pipes, error) {
	p := &pipes{w: [3]int{-1, -1, -1}}
	for i := range p.r {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
			p.closeAll()
			return nil, fmt.Errorf("pipe: %w", err)
		}
		_ = unix.SetNonblock(fds[0], true)
		p.r[i] = os.NewFile(uintptr(fds[0]), "pipe")
		p.w[i] = fds[1]
	}
	return p, nil
}

func (p *pipes) closeWrite() {
	for i, fd := range p.w {
		if fd >= 0 {
			unix.Close(fd)
			p.w[i] = -1
		}
	}
}

func (p *pipes) closeAll() {
	p.closeWrite()
	for _, f := range p.r {
		if f != nil {
			f.Close()
		}
	}
}

// readers drains a run's pipes: output into the capture, the result into
// memory (bounded: user code can write to that pipe too).
type readers struct {
	p          *pipes
	outputDone chan struct{}
	resultDone chan struct{}
	result     []byte
}

func (e *execution) startReaders(p *pipes) *readers {
	rd := &readers{p: p, outputDone: make(chan struct{}), resultDone: make(chan struct{})}
	var left atomic.Int32 // the last drain to finish closes outputDone
	left.Store(2)
	for i := range 2 {
		go func() {
			e.out.drain(i, p.r[i])
			if left.Add(-1) == 0 {
				close(rd.outputDone)
			}
		}()
	}
	go func() {
		defer close(rd.resultDone)
		b, _ := io.ReadAll(io.LimitReader(p.r[2], wire.MaxReturnValueBytes+1<<20))
		_, _ = io.Copy(io.Discard, p.r[2])
		rd.result = b
	}()
	return rd
}

// finish waits up to grace for EOF on every pipe, then closes them, which
// ends the reads of pipes something still holds open.
func (rd *readers) finish(grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	for _, ch := range []chan struct{}{rd.outputDone, rd.resultDone} {
		select {
		case <-ch:
		case <-t.C:
			for _, f := range rd.p.r {
				f.Close()
			}
		}
	}
	<-rd.outputDone
	<-rd.resultDone
	rd.p.closeAll()
}

// payload is what the child reads to know what to run.
type payload struct {
	Language string            `json:"language"`
	Code     string            `json:"code"`
	Event    json.RawMessage   `json:"event"`
	Env      map[string]string `json:"env"`
	Cwd      string            `json:"cwd"`
}

// payloadFD writes the execution's payload to a memfd: the code and event
// can be megabytes, more than one seqpacket message may carry.
func (e *execution) payloadFD() (int, error) {
	env := make(map[string]string, len(e.s.env)+len(e.req.Env))
	for k, v := range e.s.env {
		env[k] = v
	}
	for k, v := range e.req.Env {
		env[k] = v
	}
	b, err := json.Marshal(payload{Language: e.req.Language, Code: e.req.Code, Event: e.req.Event, Env: env, Cwd: e.req.Cwd})
	if err != nil {
		return -1, err
	}
	fd, err := unix.MemfdCreate("sbx-payload", unix.MFD_CLOEXEC)
	if err != nil {
		// No memfd (an old kernel, a strict profile): an unlinked file in
		// the root-only control directory does the same.
		f, ferr := os.CreateTemp(e.s.cfg.ControlDir, "payload-")
		if ferr != nil {
			return -1, fmt.Errorf("payload: memfd: %v; temp file: %w", err, ferr)
		}
		os.Remove(f.Name())
		fd, err = unix.Dup(int(f.Fd()))
		f.Close()
		if err != nil {
			return -1, err
		}
		unix.CloseOnExec(fd)
	}
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("payload: %w", err)
		}
		b = b[n:]
	}
	return fd, nil
}

func (e *execution) timeout() time.Duration {
	return time.Duration(e.req.TimeoutMs) * time.Millisecond
}

// runStateless runs the code in a fresh child of the zygote.
func (e *execution) runStateless() outcome {
	// A zygote still importing its preload list gets the request queued:
	// it forks for it first thing when it is ready.
	z, err := e.s.liveZygote(e.ctx)
	if err != nil {
		return startFailure(e.ctx, err)
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
	f := runFor{e.req.ConversationID, e.group}
	c, stop, err := z.startRun(e.ctx, f, []int{pfd, p.w[0], p.w[1], p.w[2]})
	// Nothing ran yet if the zygote died before it forked: try its
	// successor rather than fail the run.
	for try := 0; errors.Is(err, errZygoteDied) && try < 3; try++ {
		if z, err = e.s.liveZygote(e.ctx); err == nil {
			c, stop, err = z.startRun(e.ctx, f, []int{pfd, p.w[0], p.w[1], p.w[2]})
		}
	}
	unix.Close(pfd)
	// Only the child may hold the write ends, or EOF never comes.
	p.closeWrite()
	if err != nil {
		rd.finish(0)
		return startFailure(e.ctx, err)
	}
	defer stop()
	var o outcome
	o.timedOut, o.cause = e.waitOrKill(e.runEnded(c, rd), c.kill)
	if e.s.cfg.Unprivileged {
		// The worker is gone and what it left is the executor's now: no
		// result before it is dead too, as under runc, where the worker's
		// PID namespace takes it along.
		e.s.sweepOrphans()
	}
	select {
	case <-c.exited:
		o.exited, o.ws, o.lost = !c.lost, c.status, c.lost
	default:
		// Ended by its pidfd after a clean result (runEnded): it exited
		// with the result's exit code, which judge takes from the result.
		o.exited = true
	}
	rd.finish(exitGrace)
	o.result, _ = cleanResult(rd.result)
	return o
}

// startFailure is the outcome of a run that never started: cancelled if
// that is why, failed otherwise.
func startFailure(ctx context.Context, err error) outcome {
	if ctx.Err() != nil {
		return outcome{cause: context.Cause(ctx)}
	}
	return outcome{startErr: err}
}

// waitOrKill waits until done, killing the process at the deadline or on
// cancellation, and then still waits for done.
func (e *execution) waitOrKill(done <-chan struct{}, kill func()) (timedOut bool, cause error) {
	t := time.NewTimer(e.timeout())
	defer t.Stop()
	select {
	case <-done:
		return false, nil
	case <-t.C:
		timedOut = true
	case <-e.ctx.Done():
		cause = context.Cause(e.ctx)
	}
	kill()
	<-done
	return timedOut, cause
}

// resultMsg is what the Python child writes on the result pipe.
type resultMsg struct {
	ExitCode    int             `json:"exit_code"`
	Error       *wire.ExecError `json:"error"`
	ReturnValue json.RawMessage `json:"return_value"`
}

// judge turns the outcome into the result's status, exit code and error.
func (e *execution) judge(res *wire.Result, o *outcome, oomBefore uint64) {
	lostState := ""
	if o.stateLost {
		lostState = "; the context's state (its variables) was lost and its next run starts afresh"
	}
	fail := func(typ, format string, args ...any) {
		res.Status = wire.StatusFailed
		res.Error = &wire.ExecError{Type: typ, Message: fmt.Sprintf(format, args...)}
	}
	res.ExitCode = -1 // unknown: it never started, or its exit was not seen
	if o.exited {
		switch {
		case o.ws.Signaled():
			res.ExitCode = 128 + int(o.ws.Signal())
		case o.ws.Exited():
			res.ExitCode = o.ws.ExitStatus()
		}
	}
	switch {
	case o.cause != nil && !errors.Is(o.cause, errZygoteDied):
		res.Status = wire.StatusCancelled
		res.Error = &wire.ExecError{Type: wire.ErrTypeCancelled, Message: "execution cancelled: " + o.cause.Error() + lostState}
		return
	case o.timedOut:
		res.Status = wire.StatusTimeout
		res.Error = &wire.ExecError{Type: wire.ErrTypeTimeout, Message: fmt.Sprintf(
			"execution exceeded its timeout of %s and was killed with all its processes%s", e.timeout(), lostState)}
		return
	case o.startErr != nil:
		fail(wire.ErrTypeExecutor, "the execution could not start: %v", o.startErr)
		return
	case o.lost || errors.Is(o.cause, errZygoteDied):
		fail(wire.ErrTypeExecutor, "the Python zygote died during the execution, which was killed; it can be retried%s", lostState)
		return
	}
	var msg resultMsg
	haveResult := len(o.result) > 0 && json.Unmarshal(o.result, &msg) == nil
	if len(o.result) > 0 && !haveResult {
		fail(wire.ErrTypeExecutor, "the execution wrote an unreadable result (%d bytes)", len(o.result))
		return
	}
	oom := e.s.cg.oomKills() > oomBefore
	killedBy9 := o.exited && o.ws.Signaled() && o.ws.Signal() == unix.SIGKILL || res.ExitCode == 128+9
	switch {
	case oom && (killedBy9 || o.contextDied):
		fail(wire.ErrTypeOutOfMemory, "the sandbox ran out of memory (%s) and the kernel killed the execution%s",
			e.memoryLimitText(), lostState)
	case o.contextDied:
		how := "it ended"
		if o.exited {
			how = describeExit(o.ws)
		}
		fail(wire.ErrTypeExecutor, "the context process died during the run (%s)%s", how, lostState)
	case o.exited && o.ws.Signaled():
		fail(wire.ErrTypeSignal, "the execution was %s", describeExit(o.ws))
	case haveResult:
		res.ExitCode = msg.ExitCode
		res.ReturnValue = msg.ReturnValue
		if msg.Error != nil {
			res.Status, res.Error = wire.StatusFailed, msg.Error
		} else {
			res.Status = wire.StatusCompleted
		}
	case !o.exited:
		// A context run whose code closed or replaced the result pipe.
		fail(wire.ErrTypeExecutor, "the run ended without reporting a result")
	case res.ExitCode == 0:
		res.Status = wire.StatusCompleted
	case e.req.Language == wire.LanguageBash:
		fail(wire.ErrTypeNonZeroExit, "bash exited with code %d", res.ExitCode)
	default:
		fail(wire.ErrTypeNonZeroExit, "python exited with code %d without reporting a result", res.ExitCode)
	}
}

func (e *execution) memoryLimitText() string {
	if l := e.s.cg.memoryLimit(); l > 0 {
		return fmt.Sprintf("memory limit %d MiB", l>>20)
	}
	return "no memory limit is set on the sandbox itself"
}

// handleRun streams an execution's output as NDJSON and ends with its
// result. The execution is killed if the client goes away first.
func (s *Server) handleRun(w http.ResponseWriter, r *http.Request) {
	body := http.MaxBytesReader(w, r.Body, wire.MaxRequestBytes)
	req, err := wire.DecodeRunRequest(body, s.cfg.Workspace)
	if err != nil {
		writeError(w, err)
		return
	}
	// Reading to EOF lets net/http watch the connection, so that a client
	// that goes away cancels r.Context().
	_, _ = io.Copy(io.Discard, body)
	e, err := s.startExecution(req)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Execution-Id", e.id)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	send := func(chunks []chunk) error {
		for _, c := range chunks {
			if err := writeEvent(w, wire.Event{Type: streamNames[c.stream], Data: c.data}); err != nil {
				return err
			}
		}
		if len(chunks) > 0 {
			return rc.Flush()
		}
		return nil
	}
	for {
		select {
		case <-e.out.notify:
			if err := send(e.out.take(false)); err != nil {
				e.cancel(errClientGone)
				<-e.done
				return
			}
		case <-e.done:
			if send(e.out.take(true)) == nil && writeEvent(w, wire.Event{Type: "result", Result: e.res}) == nil {
				_ = rc.Flush()
			}
			return
		case <-r.Context().Done():
			e.cancel(errClientGone)
			<-e.done
			return
		}
	}
}

// writeEvent writes one NDJSON line. HTML escaping is off: return values
// and output reach the client byte for byte ("<" stays "<").
func writeEvent(w io.Writer, ev wire.Event) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(ev) // one Write, ending in a newline
}
