package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// Commands. envd's process.Process/Start runs a command and streams its
// output; here a command is a bash execution of the session, run by the
// execution service like any other (so it shows in the session's
// history), and its "pid" is a number this server hands out and maps to
// the execution while it runs. Killing it (SendSignal) cancels the
// execution: the executor kills its whole process tree.

// processConfig is envd's process.ProcessConfig.
type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

// selector is envd's process.ProcessSelector.
type selector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

// proc is a command in flight.
type proc struct {
	pid             uint32
	tenant, sandbox string
	tag             string
	config          processConfig
	run             *execution.Run
}

// processTable maps pids to the executions of commands in flight.
type processTable struct {
	mu    sync.Mutex
	next  uint32
	procs map[uint32]*proc
}

func newProcessTable() *processTable {
	return &processTable{next: 1000, procs: map[uint32]*proc{}}
}

// add gives p a pid and keeps it until its run is over.
func (t *processTable) add(p *proc) {
	t.mu.Lock()
	t.next++
	p.pid = t.next
	t.procs[p.pid] = p
	t.mu.Unlock()
	go func() {
		<-p.run.Done()
		t.mu.Lock()
		delete(t.procs, p.pid)
		t.mu.Unlock()
	}()
}

// find returns the command sel names in a tenant's sandbox.
func (t *processTable) find(tenant, sandbox string, sel selector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		if p.tenant != tenant || p.sandbox != sandbox {
			continue
		}
		if (sel.Pid != nil && *sel.Pid == p.pid) || (sel.Pid == nil && sel.Tag != nil && *sel.Tag == p.tag) {
			return p, nil
		}
	}
	return nil, fmt.Errorf("process %s not found (it ended, or never ran here): %w", sel, errdefs.ErrNotFound)
}

func (s selector) String() string {
	switch {
	case s.Pid != nil:
		return fmt.Sprintf("with pid %d", *s.Pid)
	case s.Tag != nil:
		return fmt.Sprintf("with tag %q", *s.Tag)
	}
	return "(no pid or tag given)"
}

// list returns a sandbox's commands in flight, by pid.
func (t *processTable) list(tenant, sandbox string) []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*proc
	for _, p := range t.procs {
		if p.tenant == tenant && p.sandbox == sandbox {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b *proc) int { return int(a.pid) - int(b.pid) })
	return out
}

// process serves envd's process.Process.
func (h *Handler) process(w http.ResponseWriter, r *http.Request) {
	switch m := r.PathValue("method"); m {
	case "Start":
		h.start(w, r)
	case "Connect":
		h.connect(w, r)
	case "List":
		h.listProcesses(w, r)
	case "SendSignal":
		h.sendSignal(w, r)
	default:
		// SendInput, StreamInput, CloseStdin, Update (PTY size).
		writeUnaryError(w, unimplemented("process.Process/%s is not supported by sbx: commands have no stdin and no terminal", m))
	}
}

// startRequest is envd's process.StartRequest.
type startRequest struct {
	Process processConfig `json:"process"`
	Pty     *struct{}     `json:"pty,omitempty"`
	Tag     *string       `json:"tag,omitempty"`
	Stdin   *bool         `json:"stdin,omitempty"`
}

// shells are the commands whose "-c CODE" is run as the execution's
// code: bash is what every SDK call sends.
var shells = []string{"/bin/bash", "bash", "/usr/bin/bash", "/bin/sh", "sh", "/usr/bin/sh"}

// commandCode is the bash code that runs cfg: its working directory, then
// the command.
func commandCode(cfg processConfig) (string, error) {
	if cfg.Cmd == "" {
		return "", invalid("process.cmd is empty")
	}
	for _, s := range append([]string{cfg.Cmd}, cfg.Args...) {
		if strings.IndexByte(s, 0) >= 0 {
			return "", invalid("process.cmd and args must not contain NUL")
		}
	}
	var code string
	args := cfg.Args
	if slices.Contains(shells, cfg.Cmd) {
		for len(args) > 0 && (args[0] == "-l" || args[0] == "--login") {
			args = args[1:]
		}
	}
	if slices.Contains(shells, cfg.Cmd) && len(args) >= 2 && args[0] == "-c" {
		code = args[1]
		if len(args) > 2 {
			// bash -c CODE NAME ARGS...: $0 and the positional parameters.
			code = "set -- " + quoteAll(args[3:]) + "\n" + code
		}
	} else {
		code = "exec " + quoteAll(append([]string{cfg.Cmd}, cfg.Args...))
	}
	dir := ""
	if cfg.Cwd != nil {
		dir = *cfg.Cwd
	}
	wd, err := cwd(dir)
	if err != nil {
		return "", err
	}
	return "cd -- " + shellQuote(wd) + " || exit 1\n" + code, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func quoteAll(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = shellQuote(a)
	}
	return strings.Join(q, " ")
}

// keepaliveEvery is how often a quiet command's stream carries a
// keepalive event (the SDK asks for one every 50 s).
const keepaliveEvery = 30 * time.Second

// start: process.Process/Start, server streaming: start{pid}, the output
// as data events, end{exitCode}. The command goes on if the client goes
// away (as E2B's do); SendSignal stops it.
func (h *Handler) start(w http.ResponseWriter, r *http.Request) {
	var req startRequest
	if err := readStreamRequest(r, &req); err != nil {
		h.unaryError(w, r, err)
		return
	}
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	switch {
	case req.Pty != nil:
		err = unimplemented("PTYs are not supported by sbx")
	case req.Stdin != nil && *req.Stdin:
		err = unimplemented("stdin is not supported by sbx: start commands with stdin false (the SDK's default)")
	}
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	code, err := commandCode(req.Process)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	env := maps.Clone(req.Process.Envs)
	if env == nil {
		env = map[string]string{}
	}
	if _, ok := env["HOME"]; !ok {
		env["HOME"] = homeDir // E2B's home: the workspace, through the templates' symlink
	}
	// A deadline on the call bounds the command, as envd's does; without
	// one it may run as long as the executor allows.
	timeout := float64(wire.MaxTimeoutMs / 1000)
	if d := connectTimeout(r); d > 0 {
		timeout = min(timeout, d.Seconds())
	}
	if _, err := h.live(r.Context(), tenant, id); err != nil {
		h.unaryError(w, r, err)
		return
	}
	release, err := h.openStream(tenant)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	defer release()
	run, err := h.opt.Executions.Submit(r.Context(), tenant, id, api.ExecuteRequest{
		Code: code, Language: wire.LanguageBash, Timeout: timeout, EnvVars: env,
	})
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	p := &proc{tenant: tenant, sandbox: id, config: req.Process, run: run}
	if req.Tag != nil {
		p.tag = *req.Tag
	}
	h.procs.add(p)
	h.follow(w, r, p, 0)
}

// follow streams a command from its output event i on.
func (h *Handler) follow(w http.ResponseWriter, r *http.Request, p *proc, next int) {
	s := newStream(w)
	if s.Send(processEvent{"start": map[string]uint32{"pid": p.pid}}) != nil {
		return
	}
	beat := time.NewTicker(keepaliveEvery)
	defer beat.Stop()
	for {
		evs, changed := p.run.Events(next)
		for _, ev := range evs {
			if s.Send(processEvent{"data": map[string]string{ev.Stream: base64.StdEncoding.EncodeToString([]byte(ev.Text))}}) != nil {
				return
			}
		}
		next += len(evs)
		select {
		case <-changed:
			continue
		case <-p.run.Done():
			if evs, _ := p.run.Events(next); len(evs) > 0 {
				continue
			}
			end, err := endEvent(p.run.Result())
			if end != nil {
				s.Send(processEvent{"end": end})
			}
			s.End(err)
			return
		case <-beat.C:
			if s.Send(processEvent{"keepalive": struct{}{}}) != nil {
				return
			}
		case <-r.Context().Done():
			return
		}
	}
}

// processEvent is a StartResponse / ConnectResponse: {"event": {kind: ...}}.
type processEvent map[string]any

func (e processEvent) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]any{"event": map[string]any(e)})
}

// endEvent is envd's ProcessEvent.EndEvent for an execution's result, and
// the error the stream ends with when the command did not simply exit: a
// timeout (deadline_exceeded) or no sandbox to run it in (unavailable).
func endEvent(x *api.Execution) (map[string]any, error) {
	if x.Error != nil && x.Error.Type == execution.ErrTypeUnavailable {
		return nil, &rpcError{Code: "unavailable", Message: x.Error.Message}
	}
	code := -1
	if x.ExitCode != nil {
		code = *x.ExitCode
	}
	end := map[string]any{"exitCode": code, "exited": true, "status": fmt.Sprintf("exit status %d", code)}
	switch x.Status {
	case api.ExecCancelled:
		end = map[string]any{"exitCode": -1, "exited": false, "status": "signal: killed"}
	case api.ExecTimeout:
		end = map[string]any{"exitCode": -1, "exited": false, "status": "signal: killed", "error": "command timed out"}
		return end, &rpcError{Code: "deadline_exceeded", Message: "the command ran past its timeout and was killed"}
	case api.ExecFailed:
		if x.Error != nil && x.Error.Type != wire.ErrTypeNonZeroExit {
			end["error"] = x.Error.Type + ": " + x.Error.Message
		}
	}
	return end, nil
}

// findProcess finds the process sel names in the request's sandbox, and
// the tenant it belongs to.
func (h *Handler) findProcess(r *http.Request, sel selector) (*proc, string, error) {
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		return nil, "", err
	}
	p, err := h.procs.find(tenant, id, sel)
	return p, tenant, err
}

// connect: process.Process/Connect: follow a command started earlier,
// from now on.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Process selector `json:"process"`
	}
	if err := readStreamRequest(r, &req); err != nil {
		h.unaryError(w, r, err)
		return
	}
	p, tenant, err := h.findProcess(r, req.Process)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	release, err := h.openStream(tenant)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	defer release()
	evs, _ := p.run.Events(0)
	h.follow(w, r, p, len(evs))
}

// listProcesses: process.Process/List: the sandbox's commands in flight.
func (h *Handler) listProcesses(w http.ResponseWriter, r *http.Request) {
	var req struct{}
	if err := readUnary(r, &req); err != nil {
		h.unaryError(w, r, err)
		return
	}
	id, tenant, err := h.sandboxTenant(r)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	type info struct {
		Config processConfig `json:"config"`
		Pid    uint32        `json:"pid"`
		Tag    string        `json:"tag,omitempty"`
	}
	out := struct {
		Processes []info `json:"processes"`
	}{Processes: []info{}}
	for _, p := range h.procs.list(tenant, id) {
		c := p.config
		if c.Args == nil {
			c.Args = []string{}
		}
		if c.Envs == nil {
			c.Envs = map[string]string{}
		}
		out.Processes = append(out.Processes, info{Config: c, Pid: p.pid, Tag: p.tag})
	}
	writeUnary(w, out)
}

// sendSignal: process.Process/SendSignal: SIGKILL and SIGTERM both cancel
// the command's execution (its whole process tree is killed).
func (h *Handler) sendSignal(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Process selector `json:"process"`
		Signal  any      `json:"signal"`
	}
	if err := readUnary(r, &req); err != nil {
		h.unaryError(w, r, err)
		return
	}
	switch req.Signal {
	case "SIGNAL_SIGKILL", "SIGNAL_SIGTERM", 9.0, 15.0:
	default:
		h.unaryError(w, r, invalid("signal %v: want SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Signal))
		return
	}
	p, tenant, err := h.findProcess(r, req.Process)
	if err != nil {
		h.unaryError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	if _, err := h.opt.Executions.Cancel(ctx, tenant, p.run.ID()); err != nil {
		h.unaryError(w, r, err)
		return
	}
	writeUnary(w, struct{}{})
}
