package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/template"
)

// newJob registers a build of this process before its record is written,
// so that no reader of the record takes it for an abandoned one.
func (r *Registry) newJob(tenant string, spec template.Spec, id string) *job {
	ctx, cancel := context.WithCancelCause(r.ctx)
	j := &job{tenant: tenant, name: spec.Name, id: id, spec: spec, ctx: ctx, cancel: cancel, log: newBuildLog()}
	r.mu.Lock()
	r.jobs[id] = j
	r.mu.Unlock()
	return j
}

// drop forgets a job whose record was not written.
func (r *Registry) drop(j *job) {
	if j == nil {
		return
	}
	j.cancel(nil)
	r.mu.Lock()
	delete(r.jobs, j.id)
	r.mu.Unlock()
}

// start runs j in the background, once a build slot is free.
func (r *Registry) start(j *job) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.drop(j)
		defer j.log.close()
		r.run(j)
	}()
}

func (r *Registry) run(j *job) {
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	case <-j.ctx.Done():
		r.end(j, nil, context.Cause(j.ctx))
		return
	}
	if err := r.mark(j); err != nil {
		r.end(j, nil, err)
		return
	}
	watched := make(chan struct{})
	stopWatch := make(chan struct{})
	go func() {
		defer close(watched)
		r.watch(j, stopWatch)
	}()
	t, err := r.cfg.Templates.Ensure(j.ctx, j.spec, j.log)
	close(stopWatch)
	<-watched
	if err == nil && t.SizeBytes > r.cfg.MaxBuildBytes {
		// Too large to keep: the tenant's builds are on the server's disk.
		if rerr := r.cfg.Templates.Remove(context.Background(), t.Hash); rerr != nil {
			r.log.Error("removing a template build over the size limit", "tenant", j.tenant, "template", j.name, "err", rerr)
		}
		t, err = nil, fmt.Errorf("the root filesystem is %d MiB, more than the %d MiB a template may take: %w", t.SizeBytes>>20, r.cfg.MaxBuildBytes>>20, errdefs.ErrResourceExhausted)
	}
	r.end(j, t, err)
	if t != nil {
		r.prune(context.Background(), j.tenant, j.name)
	}
}

// mark records that j's build has started, unless it was cancelled,
// superseded or deleted while it waited.
func (r *Registry) mark(j *job) error {
	_, err := r.update(j.ctx, j.tenant, j.name, func(rec *record) (bool, error) {
		switch {
		case rec.Build.BuildID != j.id:
			return false, errSuperseded
		case rec.Build.CancelRequested:
			return false, errCancelled
		}
		now := time.Now().UTC()
		rec.Build.Status, rec.Build.StartedAt = api.TemplateBuilding, &now
		return true, nil
	})
	if errors.Is(err, errdefs.ErrNotFound) {
		return errDeleted
	}
	return err
}

// watch cancels j when its record asks for it: a cancel through another
// replica, a newer spec, a delete.
func (r *Registry) watch(j *job, stop <-chan struct{}) {
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-j.ctx.Done():
			return
		case <-tick.C:
		}
		rec, _, err := r.get(j.ctx, j.tenant, j.name)
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			j.cancel(errDeleted)
		case err != nil:
			// The store is away for a moment: go on building.
		case rec.Build.BuildID != j.id:
			j.cancel(errSuperseded)
		case rec.Build.CancelRequested:
			j.cancel(errCancelled)
		}
	}
}

// end records how j's build ended, with the end of its log, and keeps the
// whole log on this server.
func (r *Registry) end(j *job, t *template.Template, err error) {
	status, msg := api.TemplateReady, ""
	if err != nil {
		status, msg = api.TemplateFailed, err.Error()
		if j.ctx.Err() != nil {
			cause := context.Cause(j.ctx)
			if errors.Is(cause, context.Canceled) {
				cause = errors.New("the server is shutting down")
			}
			status, msg = api.TemplateCancelled, "cancelled: "+cause.Error()
			t = nil
		}
	}
	if msg != "" {
		fmt.Fprintf(j.log, "template %s: %s\n", j.name, msg)
	}
	if r.cfg.LogDir != "" {
		if err := os.MkdirAll(r.cfg.LogDir, 0o700); err == nil {
			os.WriteFile(r.logPath(j.id), j.log.bytes(), 0o600)
		}
	}
	// The record is written even when the registry is closing: it must
	// not say building for a build that ended.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, uerr := r.update(ctx, j.tenant, j.name, func(rec *record) (bool, error) {
		if rec.Build.BuildID != j.id {
			return false, nil // superseded: the newer build says
		}
		r.finish(rec, status, msg, t)
		rec.Build.LogTail = j.log.tail(logTail)
		return true, nil
	})
	if uerr != nil && !errors.Is(uerr, errdefs.ErrNotFound) {
		r.log.Error("recording a template build's end", "tenant", j.tenant, "template", j.name, "build", j.id, "err", uerr)
	}
	r.log.Info("template build ended", "tenant", j.tenant, "template", j.name, "build", j.id, "status", status, "error", msg)
}

// Logs sends a build's log to emit as it grows: all of it, then, with
// follow, more until the build ends. A build another replica runs shows
// its log's end when it ends.
func (r *Registry) Logs(ctx context.Context, tenant, name, buildID string, follow bool, emit func([]byte) error) error {
	rec, _, err := r.get(ctx, tenant, name)
	if err != nil {
		return err
	}
	if rec.Build.BuildID != buildID && !slices.ContainsFunc(rec.Versions, func(v api.TemplateVersion) bool { return v.BuildID == buildID }) {
		return fmt.Errorf("template %q: build %s: %w", name, buildID, errdefs.ErrNotFound)
	}
	if j := r.local(buildID); j != nil {
		for off := 0; ; {
			chunk, done, wake := j.log.read(off)
			if len(chunk) > 0 {
				if err := emit(chunk); err != nil {
					return err
				}
				off += len(chunk)
			}
			if done || !follow {
				return nil
			}
			select {
			case <-wake:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	if b, err := os.ReadFile(r.logPath(buildID)); err == nil {
		return emit(b)
	}
	for {
		rec = r.settle(ctx, tenant, name, rec)
		switch {
		case rec.Build.BuildID != buildID:
			return emit([]byte("this build's log is on the server that ran it\n"))
		case !rec.Build.running():
			return emit([]byte(rec.Build.LogTail))
		case !follow:
			return emit(fmt.Appendf(nil, "build %s is %s on another server; its log shows here when it ends\n", buildID, rec.Build.Status))
		}
		select {
		case <-time.After(watchEvery):
		case <-ctx.Done():
			return ctx.Err()
		}
		if rec, _, err = r.get(ctx, tenant, name); err != nil {
			return err
		}
	}
}

// buildLog is a build's log as it grows, for its readers.
type buildLog struct {
	mu        sync.Mutex
	buf       []byte
	truncated bool
	done      bool
	wake      chan struct{} // closed at the next write or at close
}

func newBuildLog() *buildLog { return &buildLog{wake: make(chan struct{})} }

// Write appends p; past maxLog the log says it was cut and keeps no more.
func (l *buildLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case len(l.buf)+len(p) <= maxLog:
		l.buf = append(l.buf, p...)
	case !l.truncated:
		l.truncated = true
		l.buf = append(l.buf, "\n[the log is longer than this; the rest is not kept]\n"...)
	default:
		return len(p), nil
	}
	if l.done {
		return len(p), nil
	}
	close(l.wake)
	l.wake = make(chan struct{})
	return len(p), nil
}

func (l *buildLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.done = true
		close(l.wake)
	}
}

// read returns what the log has past off, whether it is complete, and a
// channel closed when there is more.
func (l *buildLog) read(off int) ([]byte, bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.buf[off:]), l.done, l.wake
}

func (l *buildLog) bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.buf)
}

// tail is the last n bytes of the log, from a line's start where there is
// one.
func (l *buildLog) tail(n int) string {
	b := l.bytes()
	if len(b) <= n {
		return string(b)
	}
	b = b[len(b)-n:]
	for i, c := range b {
		if c == '\n' && i+1 < len(b) {
			return string(b[i+1:])
		}
	}
	return string(b)
}
