// Package execution runs code in sessions: submit, wait, stream, cancel and
// history (R-10..R-14).
//
// Submit writes the execution's record (pending) and hands it to a
// goroutine that acquires the session's sandbox and runs the code on its
// executor. While it runs, the execution lives in memory too, where waiters
// and streams follow it; its end is written to the store before it leaves
// memory, so a result outlives the server. Two store writes per execution:
// one at submit, one at the end.
package execution

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"sync"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// Error types the control plane gives executions that never got to run or
// whose end it could not see.
const (
	ErrTypeUnavailable    = api.ErrTypeSandboxUnavailable
	ErrTypeSandboxLost    = "SandboxLost"
	ErrTypeServerRestart  = "ServerRestarted"
	ErrTypeSessionDeleted = "SessionDeleted"
)

// Options configure a Service.
type Options struct {
	Store    store.Store
	Sessions *session.Manager
	Log      *slog.Logger
	// Finished, if set, hears of every execution's end (metrics).
	Finished func(status string, d time.Duration)
	// Publish, if set, is told of every execution's start and end
	// (api.EventExecutionStarted, api.EventExecutionFinished; R-87). It
	// must not wait: it is called on the execution's way.
	Publish func(e events.Event)
	// Owner names this server among the replicas sharing the store: the
	// executions it runs carry it, and only it or a server that finds it
	// gone fails them when they are left unfinished.
	Owner string
	// Alive says whether the server named owner still runs (its liveness
	// lease, internal/app). nil: no other server does, so an unfinished
	// execution of another owner is a previous process's.
	Alive func(ctx context.Context, owner string) (bool, error)
}

// Service runs executions.
type Service struct {
	opt  Options
	log  *slog.Logger
	ctx  context.Context
	stop context.CancelCauseFunc
	wg   sync.WaitGroup

	mu   sync.Mutex
	live map[string]*Run
	hist historySizes // record.go
}

// New returns a service; Close stops it.
func New(opt Options) *Service {
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Finished == nil {
		opt.Finished = func(string, time.Duration) {}
	}
	if opt.Publish == nil {
		opt.Publish = func(events.Event) {}
	}
	ctx, stop := context.WithCancelCause(context.Background())
	s := &Service{opt: opt, log: opt.Log, ctx: ctx, stop: stop, live: map[string]*Run{}}
	opt.Sessions.OnDelete(s.cancelSession)
	if opt.Alive != nil {
		s.wg.Add(1)
		go s.watchCancels()
	}
	return s
}

// A cancellation asked of a replica that does not run the execution is a
// lease in the store, cancel/ID, which the replica running it looks for
// every cancelWatch for its runs older than that; their output so far
// goes to their records as often (flush), up to flushMax bytes.
const flushMax = 1 << 20
const cancelWatch = time.Second

func cancelLease(id string) string { return "cancel/" + id }

// watchCancels cancels this replica's runs that another replica was asked
// to cancel, and writes their output so far to their records.
func (s *Service) watchCancels() {
	defer s.wg.Done()
	t := time.NewTicker(cancelWatch)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		runs := make([]*Run, 0, len(s.live))
		for _, r := range s.live {
			if time.Since(r.rec.CreatedAt) >= cancelWatch {
				runs = append(runs, r)
			}
		}
		s.mu.Unlock()
		for _, r := range runs {
			ctx, cancel := context.WithTimeout(s.ctx, cancelWatch)
			holder, asked, err := s.opt.Store.LeaseHolder(ctx, cancelLease(r.rec.ID))
			if err == nil && asked {
				s.cancelRun(ctx, r, &api.ExecError{Type: wire.ErrTypeCancelled, Message: "cancelled by request (through replica " + holder + ")"})
			}
			cancel()
			s.flush(r, false)
		}
	}
}

// Close cancels the executions in flight and waits for them to be
// recorded.
func (s *Service) Close() {
	s.stop(&execError{Type: wire.ErrTypeCancelled, Message: "the server shut down while this execution ran"})
	s.wg.Wait()
}

// Recover marks as failed the executions left pending or running by a
// server that is gone (a previous process, a replica that died): their
// outcome was lost with it. This server's own, and those of servers still
// alive, are left alone. A server runs it at start, and the replica that
// runs the reaper runs it again every few seconds.
func (s *Service) Recover(ctx context.Context) error {
	recs, err := s.opt.Store.ListUnfinishedExecutions(ctx)
	if err != nil {
		return err
	}
	alive := map[string]bool{}
	failed := 0
	for _, rec := range recs {
		if rec.Owner == s.opt.Owner && rec.Owner != "" {
			continue
		}
		if rec.Owner != "" && s.opt.Alive != nil {
			live, seen := alive[rec.Owner]
			if !seen {
				if live, err = s.opt.Alive(ctx, rec.Owner); err != nil {
					return err
				}
				alive[rec.Owner] = live
			}
			if live {
				continue
			}
		}
		x := summary(rec)
		var so api.Execution // the output so far its replica recorded
		if len(rec.Result) > 0 && json.Unmarshal(rec.Result, &so) == nil {
			x.Stdout, x.Stderr = so.Stdout, so.Stderr
		}
		now := time.Now().UTC()
		x.Status, x.FinishedAt = api.ExecFailed, &now
		x.Error = &api.ExecError{Type: ErrTypeServerRestart, Message: "the server running this execution stopped (a restart or a crash) while it was " + rec.Status + "; its outcome is unknown: submit it again"}
		rec.Status, rec.FinishedAt = x.Status, now
		rec.Result = resultRecord(x)
		err := s.opt.Store.UpdateExecution(ctx, rec)
		if errors.Is(err, errdefs.ErrConflict) || errors.Is(err, errdefs.ErrNotFound) {
			continue // it ended (or went) since it was listed: that outcome stands
		}
		if err != nil {
			return err
		}
		s.published(rec, x)
		failed++
	}
	if failed > 0 {
		s.log.Warn("executions of a server that stopped marked failed", "count", failed)
	}
	return nil
}

// Run is an execution in flight.
type Run struct {
	rec     store.Execution
	req     wire.RunRequest
	started time.Time
	cancel  context.CancelCauseFunc
	done    chan struct{}
	span    trace.Span // from submit to the recorded end (trace.go)

	mu      sync.Mutex
	status  string
	events  []Event
	changed chan struct{} // closed and replaced at every change
	lease   *session.Lease
	result  *api.Execution
	// With other replicas reading the store, the run's record says
	// running, and then its output so far, while it runs (flush). These
	// writes and the result's take flushMu; finished says the result is
	// written, after which nothing else may be. flushed counts the
	// events the record has.
	flushMu  sync.Mutex
	finished bool
	flushed  int
}

// Event is a piece of an execution's output.
type Event struct {
	Stream string // stdout or stderr
	Text   string
}

// ID is the execution's id.
func (r *Run) ID() string { return r.rec.ID }

// Done is closed when the execution is over and recorded.
func (r *Run) Done() <-chan struct{} { return r.done }

// Result is the final result; nil before Done.
func (r *Run) Result() *api.Execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.result
}

// Events returns the output from index i on, and a channel closed when
// there is more (or the run ends).
func (r *Run) Events(i int) ([]Event, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i > len(r.events) {
		i = len(r.events)
	}
	return r.events[i:], r.changed
}

func (r *Run) notifyLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Submit validates req, records the execution and starts it. The session
// must exist (ErrNotFound) and not be terminated.
func (s *Service) Submit(ctx context.Context, tenant, sessionID string, req api.ExecuteRequest) (_ *Run, err error) {
	ctx, span := startSpan(ctx, tenant, sessionID)
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
		}
	}()
	rreq, err := toRunRequest(req)
	if err != nil {
		return nil, err
	}
	sess, err := s.opt.Sessions.Get(ctx, tenant, sessionID)
	if err != nil {
		return nil, err
	}
	if sess.Status == api.StatusTerminated {
		return nil, fmt.Errorf("session %q is terminated; create it again to run code: %w", sessionID, errdefs.ErrFailedPrecondition)
	}
	// The session's variables go with every run: a sandbox from a warm
	// pool was started before the session existed. The request's win.
	if len(sess.Config.Env) > 0 {
		env := maps.Clone(sess.Config.Env)
		maps.Copy(env, rreq.Env)
		rreq.Env = env
		check := *rreq // Validate would fill in the cwd (toRunRequest)
		if err := check.Validate(); err != nil {
			return nil, fmt.Errorf("env_vars with the session's: %w", err)
		}
	}
	id := newExecID()
	rreq.ID = id
	if span.IsRecording() {
		span.SetAttributes(attribute.String("sbx.execution.id", id), attribute.String("sbx.execution.language", rreq.Language))
	}
	stored := requestRecord(req, rreq.Language, rreq.TimeoutMs)
	now := time.Now().UTC()
	r := &Run{
		rec: store.Execution{
			Tenant: tenant, ID: id, SessionID: sessionID, Status: api.ExecPending,
			Language: rreq.Language, ConversationID: rreq.ConversationID, ContextID: rreq.ContextID,
			Request: stored, CreatedAt: now, Owner: s.opt.Owner,
		},
		req: *rreq, status: api.ExecPending, done: make(chan struct{}), changed: make(chan struct{}), span: span,
	}
	if err := s.opt.Store.CreateExecution(ctx, &r.rec); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancelCause(s.ctx)
	r.cancel = cancel
	s.mu.Lock()
	s.live[id] = r
	s.mu.Unlock()
	s.wg.Add(1)
	go s.run(trace.ContextWithSpan(runCtx, span), r)
	return r, nil
}

// Check says whether Submit would refuse req as invalid, before anything
// is made for it.
func Check(req api.ExecuteRequest) error {
	_, err := toRunRequest(req)
	return err
}

// toRunRequest checks every field of an execute request and makes
// the executor's request of it.
func toRunRequest(req api.ExecuteRequest) (*wire.RunRequest, error) {
	if req.Language == "" {
		req.Language = wire.LanguagePython
	}
	if math.IsNaN(req.Timeout) || req.Timeout < 0 || req.Timeout > wire.MaxTimeoutMs/1000 {
		return nil, fmt.Errorf("timeout %v: want 0.001..%d seconds (0 for the default, 30): %w", req.Timeout, wire.MaxTimeoutMs/1000, errdefs.ErrInvalidArgument)
	}
	if req.ConversationID != "" && !session.ValidID(req.ConversationID) {
		return nil, fmt.Errorf("conversation_id %q: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\": %w", req.ConversationID, errdefs.ErrInvalidArgument)
	}
	if req.ContextID != "" && !session.ValidID(req.ContextID) {
		return nil, fmt.Errorf("context_id %q: want 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\": %w", req.ContextID, errdefs.ErrInvalidArgument)
	}
	if req.Code == "" {
		return nil, fmt.Errorf("code is empty: %w", errdefs.ErrInvalidArgument)
	}
	r := &wire.RunRequest{
		Language: req.Language, Code: req.Code, Event: req.Event, Env: req.EnvVars,
		TimeoutMs: int64(math.Ceil(req.Timeout * 1000)), ContextID: req.ContextID,
		ConversationID: req.ConversationID,
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	// Validate's cwd is "/workspace", where a container mounts the
	// workspace; where the workspace is is the executor's to say (the
	// in-process runtime of the tests has it at a host path), and it
	// takes its own for a run that names none.
	r.Cwd = ""
	return r, nil
}

// run takes the execution through the sandbox to its end.
func (s *Service) run(ctx context.Context, r *Run) {
	defer s.wg.Done()
	defer r.cancel(nil)
	// A sandbox found dead before the code reached it (killed from
	// outside, say) is replaced and the run tried once more; one that dies
	// during the run fails the run, and the next gets a new sandbox.
	for attempt := 0; ; attempt++ {
		lease, err := s.opt.Sessions.Acquire(ctx, r.rec.Tenant, r.rec.SessionID)
		if err != nil {
			kind := ErrTypeUnavailable
			switch {
			case errors.Is(err, errdefs.ErrResourceExhausted):
				kind = api.ErrTypeQuotaExceeded
			case errors.Is(err, template.ErrNotBuilt) && errors.Is(err, errdefs.ErrFailedPrecondition):
				kind = api.ErrTypeTemplateNotBuilt
			}
			s.finish(r, nil, s.failure(ctx, err, kind))
			return
		}
		r.mu.Lock()
		r.status, r.lease, r.started = api.ExecRunning, lease, time.Now().UTC()
		r.notifyLocked()
		r.mu.Unlock()
		if attempt == 0 {
			s.opt.Publish(events.Event{Tenant: r.rec.Tenant, SessionID: r.rec.SessionID, Type: api.EventExecutionStarted, Data: api.EventData{
				Status: api.ExecRunning, ExecutionID: r.rec.ID, Language: r.rec.Language, ConversationID: r.rec.ConversationID, SandboxID: lease.SandboxID,
			}})
		}
		if s.opt.Alive != nil && attempt == 0 {
			// Other replicas read the record: it says running too,
			// written beside the run, not before it.
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.flush(r, true)
			}()
		}
		// The executor enforces the timeout; this bound only keeps a hung
		// sandbox from holding the execution for ever.
		rctx, cancel := context.WithTimeout(ctx, time.Duration(r.req.TimeoutMs)*time.Millisecond+time.Minute)
		res, err := lease.Client.Run(rctx, r.req, func(stream, data string) {
			r.mu.Lock()
			r.events = append(r.events, Event{Stream: stream, Text: data})
			r.notifyLocked()
			r.mu.Unlock()
		})
		cancel()
		var saveErr error
		if err == nil && res.WorkspaceUnchanged {
			lease.ReleaseUnchanged()
		} else {
			saveErr = lease.Release()
		}
		if err == nil && errors.Is(saveErr, errdefs.ErrUnavailable) && ctx.Err() == nil && lease.Lost(ctx) {
			// It ran to its end in a sandbox that was gone meanwhile (a
			// Pod deleted while its container still ran): what it wrote
			// is lost with it, so it is not reported done.
			s.finish(r, nil, s.failure(ctx, fmt.Errorf("the sandbox was deleted before what the execution wrote was saved (the session's next execution gets a new one over the workspace as the last saved call left it): %w", saveErr), ErrTypeSandboxLost))
			return
		}
		if err == nil && res.Status == wire.StatusCancelled && ctx.Err() == nil && lease.Lost(ctx) {
			// Cancelled by no one here: its sandbox went away under it
			// (a Pod deleted: the kubelet's SIGTERM ends the executor,
			// which answers its runs cancelled on its way out).
			why := "cancelled"
			if res.Error != nil {
				why = res.Error.Message
			}
			s.finish(r, nil, s.failure(ctx, fmt.Errorf("the sandbox died during the execution (the session's next execution gets a new one over the same workspace): %s", why), ErrTypeSandboxLost))
			return
		}
		if err == nil {
			s.finish(r, res, nil)
			return
		}
		if ctx.Err() == nil && lease.Lost(ctx) {
			if attempt == 0 && notSent(err) {
				continue
			}
			err = fmt.Errorf("the sandbox died during the execution (the session's next execution gets a new one over the same workspace): %w", err)
		}
		s.finish(r, nil, s.failure(ctx, err, ErrTypeSandboxLost))
		return
	}
}

// notSent reports whether a run's error means the executor never took
// the run: no connection, or one that broke before any answer (a sandbox
// killed while the request was on its way).
func notSent(err error) bool { return errors.Is(err, execclient.ErrNoAnswer) }

// failure describes why an execution ended without a result: cancelled
// (by a user or a session's deletion) or the sandbox was not there.
func (s *Service) failure(ctx context.Context, err error, kind string) *api.ExecError {
	if cause := context.Cause(ctx); cause != nil {
		var ee *execError
		if errors.As(cause, &ee) {
			e := api.ExecError(*ee)
			return &e
		}
		return &api.ExecError{Type: wire.ErrTypeCancelled, Message: cause.Error()}
	}
	return &api.ExecError{Type: kind, Message: err.Error()}
}

// execError carries an ExecError as a context's cancellation cause.
type execError api.ExecError

func (e *execError) Error() string { return e.Message }

// finish records the end of r and lets it go.
func (s *Service) finish(r *Run, res *wire.Result, fail *api.ExecError) {
	r.mu.Lock()
	x := summary(&r.rec)
	if !r.started.IsZero() {
		t := r.started
		x.StartedAt = &t
	}
	r.mu.Unlock()
	now := time.Now().UTC()
	x.FinishedAt = &now
	if res != nil {
		x.Status = string(res.Status)
		x.Stdout, x.Stderr = res.Stdout, res.Stderr
		x.StdoutTruncated, x.StderrTruncated = res.StdoutTruncated, res.StderrTruncated
		code := res.ExitCode
		x.ExitCode = &code
		x.ReturnValue = res.ReturnValue
		if res.Error != nil {
			x.Error = &api.ExecError{Type: res.Error.Type, Message: res.Error.Message, Traceback: res.Error.Traceback}
		}
		x.Artifacts = res.Artifacts
		if !res.StartedAt.IsZero() {
			st, fin := res.StartedAt.UTC(), res.FinishedAt.UTC()
			x.StartedAt, x.FinishedAt = &st, &fin
		}
		x.DurationMs = res.DurationMs
	} else {
		x.Status = api.ExecFailed
		if fail.Type == wire.ErrTypeCancelled || fail.Type == ErrTypeSessionDeleted {
			x.Status = api.ExecCancelled
		}
		x.Error = fail
		r.mu.Lock()
		for _, ev := range r.events {
			if ev.Stream == "stdout" {
				x.Stdout += ev.Text
			} else {
				x.Stderr += ev.Text
			}
		}
		r.mu.Unlock()
		if x.StartedAt != nil {
			x.DurationMs = now.Sub(*x.StartedAt).Milliseconds()
		}
	}
	if x.Artifacts == nil {
		x.Artifacts = []string{}
	}
	rec := r.rec
	rec.Status = x.Status
	if x.StartedAt != nil {
		rec.StartedAt = *x.StartedAt
	}
	rec.FinishedAt = *x.FinishedAt
	rec.Result = resultRecord(x)
	r.flushMu.Lock() // after any write of the run's progress
	err := s.opt.Store.UpdateExecution(context.Background(), &rec)
	told := false // the outcome recorded elsewhere was told of there
	if errors.Is(err, errdefs.ErrConflict) {
		// Another process wrote an outcome first: the replica running the
		// reaper took this one for dead (its liveness lease lapsed) and
		// failed the run, and clients may have read that. The record is
		// final, and this process answers what it says too.
		if cur, gerr := s.opt.Store.GetExecution(context.Background(), rec.Tenant, rec.ID); gerr == nil {
			if fx, ferr := fromRecord(cur, true); ferr == nil {
				s.log.Warn("an execution ended after another replica recorded its outcome; that outcome stands",
					"execution", rec.ID, "ran", x.Status, "recorded", fx.Status)
				x, rec = fx, *cur
				err, told = nil, true
			}
		}
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Error("recording execution result", "execution", rec.ID, "err", err)
	}
	r.finished = true
	r.flushMu.Unlock()
	s.opt.Finished(x.Status, time.Duration(x.DurationMs)*time.Millisecond)
	// Told before the waiters hear: a client that saw the result and then
	// changes the session (through this process) is told of after it.
	if !told {
		s.published(&rec, x)
	}
	r.mu.Lock()
	// The record's key (tenant, id, session, creation) is read without
	// r.mu (Live, ID, cancelSession, watchCancels): only what changes is
	// written.
	r.status, r.result = x.Status, x
	r.rec.Status, r.rec.StartedAt, r.rec.FinishedAt, r.rec.Result, r.rec.Owner = rec.Status, rec.StartedAt, rec.FinishedAt, rec.Result, rec.Owner
	r.notifyLocked()
	r.mu.Unlock()
	s.mu.Lock()
	delete(s.live, r.rec.ID)
	s.mu.Unlock()
	endSpan(r.span, x)
	close(r.done)
	// The session keeps its tenant's share of history: as each
	// execution ends, the oldest finished ones beyond it go. (Pending and
	// running ones stay; the last of them to end trims.)
	if keep := s.opt.Sessions.Limits(rec.Tenant).History; keep > 0 {
		if _, err := s.opt.Store.TrimExecutions(context.Background(), rec.Tenant, rec.SessionID, keep); err != nil {
			s.log.Warn("trimming execution history", "tenant", rec.Tenant, "session", rec.SessionID, "err", err)
		}
	}
	// And the tenant keeps its history_size over all its sessions.
	s.keepHistorySize(rec.Tenant, store.RecordBytes(&rec))
}

// published tells Options.Publish of an execution's end, as recorded:
// its status, duration, exit code and error type, never its output.
func (s *Service) published(rec *store.Execution, x *api.Execution) {
	d := api.EventData{
		Status: x.Status, ExecutionID: rec.ID, Language: rec.Language, ConversationID: rec.ConversationID,
		ExitCode: x.ExitCode,
	}
	if x.StartedAt != nil {
		ms := x.DurationMs
		d.DurationMs = &ms
	}
	if x.Error != nil {
		d.ErrorType = x.Error.Type
	}
	s.opt.Publish(events.Event{Tenant: rec.Tenant, SessionID: rec.SessionID, Type: api.EventExecutionFinished, Data: d})
}

// summary is an execution's record as the API shows it, without outputs.
func summary(rec *store.Execution) *api.Execution { return fromSummary(rec.Summary()) }

// fromSummary is what a listing shows of an execution. Its duration is
// the one its result has: the executor's finish less its start.
func fromSummary(rec *store.ExecutionSummary) *api.Execution {
	x := &api.Execution{
		ExecutionID: rec.ID, SessionID: rec.SessionID, Status: rec.Status, Language: rec.Language,
		ConversationID: rec.ConversationID, ContextID: rec.ContextID, CreatedAt: rec.CreatedAt,
		Artifacts: []string{},
	}
	if !rec.StartedAt.IsZero() {
		t := rec.StartedAt
		x.StartedAt = &t
	}
	if !rec.FinishedAt.IsZero() {
		t := rec.FinishedAt
		x.FinishedAt = &t
		if x.StartedAt != nil {
			x.DurationMs = t.Sub(*x.StartedAt).Milliseconds()
		}
	}
	return x
}

// Live returns the execution if it is in flight in this server.
func (s *Service) Live(tenant, id string) *Run {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.live[id]; r != nil && r.rec.Tenant == tenant {
		return r
	}
	return nil
}

// snapshot is r's state now: status, timings and, with output, what it
// printed so far.
func (r *Run) snapshot(output bool) *api.Execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.result != nil {
		if output {
			return r.result
		}
		return stripped(r.result)
	}
	x := summary(&r.rec)
	x.Status = r.status
	if !r.started.IsZero() {
		t := r.started
		x.StartedAt = &t
		x.DurationMs = time.Since(t).Milliseconds()
	}
	if output {
		for _, ev := range r.events {
			if ev.Stream == "stdout" {
				x.Stdout += ev.Text
			} else {
				x.Stderr += ev.Text
			}
		}
	}
	return x
}

func stripped(x *api.Execution) *api.Execution {
	c := *x
	c.Stdout, c.Stderr, c.ReturnValue, c.Error, c.ExitCode = "", "", nil, nil, nil
	c.StdoutTruncated, c.StderrTruncated = false, false
	c.Artifacts, c.Truncated = []string{}, nil
	return &c
}

// Get returns an execution's status and timings (output with output).
func (s *Service) Get(ctx context.Context, tenant, id string, output bool) (*api.Execution, error) {
	if r := s.Live(tenant, id); r != nil {
		return r.snapshot(output), nil
	}
	rec, err := s.opt.Store.GetExecution(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return fromRecord(rec, output)
}

func fromRecord(rec *store.Execution, output bool) (*api.Execution, error) {
	if len(rec.Result) == 0 {
		return summary(rec), nil
	}
	var x api.Execution
	if err := json.Unmarshal(rec.Result, &x); err != nil {
		return nil, fmt.Errorf("execution %s: stored result: %w", rec.ID, err)
	}
	if x.Artifacts == nil {
		x.Artifacts = []string{}
	}
	if !output {
		return stripped(&x), nil
	}
	return &x, nil
}

// Wait returns the execution's result once it is over, or its state when
// ctx ends first. An execution another replica runs is watched in the
// store, whose record it finishes.
func (s *Service) Wait(ctx context.Context, tenant, id string) (*api.Execution, error) {
	if r := s.Live(tenant, id); r != nil {
		select {
		case <-r.done:
		case <-ctx.Done():
		}
		return r.snapshot(true), nil
	}
	poll := 20 * time.Millisecond
	for {
		x, err := s.Get(ctx, tenant, id, true)
		if err != nil || !unfinished(x.Status) {
			return x, err
		}
		t := time.NewTimer(poll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return x, nil
		}
		poll = min(2*poll, 500*time.Millisecond)
	}
}

func unfinished(status string) bool {
	return status == api.ExecPending || status == api.ExecRunning || status == api.ExecSubmitted
}

// Cancel stops an execution and returns its state after that. Cancelling
// one that is over changes nothing.
func (s *Service) Cancel(ctx context.Context, tenant, id string) (*api.Execution, error) {
	r := s.Live(tenant, id)
	if r == nil {
		x, err := s.Get(ctx, tenant, id, true)
		if err != nil || !unfinished(x.Status) || s.opt.Alive == nil {
			return x, err
		}
		// Another replica runs it: ask through the store, and wait for
		// the end as below.
		if _, _, err := s.opt.Store.TryLease(ctx, cancelLease(id), s.opt.Owner, time.Minute); err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return s.Wait(wctx, tenant, id)
	}
	s.cancelRun(ctx, r, &api.ExecError{Type: wire.ErrTypeCancelled, Message: "cancelled by request"})
	t := time.NewTimer(10 * time.Second)
	defer t.Stop()
	select {
	case <-r.done:
	case <-t.C:
	case <-ctx.Done():
	}
	return r.snapshot(true), nil
}

func (s *Service) cancelRun(ctx context.Context, r *Run, why *api.ExecError) {
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	if lease != nil {
		// The executor kills the process tree and reports "cancelled",
		// with the output so far.
		if ok, err := lease.Client.Cancel(ctx, r.rec.ID); err == nil && ok {
			return
		}
	}
	r.cancel((*execError)(why))
}

// cancelSession cancels every execution in flight in a session that is
// being deleted.
func (s *Service) cancelSession(tenant, id string) {
	s.mu.Lock()
	var runs []*Run
	for _, r := range s.live {
		if r.rec.Tenant == tenant && r.rec.SessionID == id {
			runs = append(runs, r)
		}
	}
	s.mu.Unlock()
	for _, r := range runs {
		r.cancel((*execError)(&api.ExecError{Type: ErrTypeSessionDeleted, Message: "the session was deleted"}))
	}
}

// List returns a page of a session's executions, newest first.
func (s *Service) List(ctx context.Context, tenant, sessionID string, limit int, token string) ([]*api.Execution, string, error) {
	if _, err := s.opt.Sessions.Get(ctx, tenant, sessionID); err != nil {
		return nil, "", err
	}
	recs, next, err := s.opt.Store.ListExecutions(ctx, tenant, sessionID, limit, token)
	if err != nil {
		return nil, "", err
	}
	out := make([]*api.Execution, 0, len(recs))
	for _, rec := range recs {
		if r := s.Live(tenant, rec.ID); r != nil {
			out = append(out, r.snapshot(false))
			continue
		}
		out = append(out, fromSummary(rec))
	}
	return out, next, nil
}

func newExecID() string {
	b := make([]byte, 10)
	rand.Read(b)
	return "exec-" + hex.EncodeToString(b)
}

// flush writes r's progress to its record, for other replicas to read:
// that it runs (first), and its output so far when there is new output,
// up to flushMax bytes (the result has it all). Nothing is written once
// the result is.
func (s *Service) flush(r *Run, first bool) {
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	r.mu.Lock()
	n, started := len(r.events), !r.started.IsZero()
	r.mu.Unlock()
	if r.finished || !started || (!first && n == r.flushed) {
		return
	}
	x := r.snapshot(true)
	if len(x.Stdout)+len(x.Stderr) > flushMax {
		return
	}
	r.mu.Lock()
	rec := r.rec
	r.mu.Unlock()
	rec.Status = api.ExecRunning
	if x.StartedAt != nil {
		rec.StartedAt = *x.StartedAt
	}
	if n > 0 {
		rec.Result = resultRecord(x)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.opt.Store.UpdateExecution(ctx, &rec); err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrConflict) { // gone, or failed by another replica
			s.log.Warn("recording a running execution's progress", "execution", rec.ID, "err", err)
		}
		return
	}
	r.flushed = n
}
