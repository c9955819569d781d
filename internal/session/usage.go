package session

import (
	"context"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// SandboxRef names a session's sandbox, for reading its usage (R-86,
// internal/usage): its stats through its runtime, and its workspace
// volume's disk quota.
type SandboxRef struct {
	Tenant, Session string
	// ID is the sandbox's id on Runtime.
	ID      string
	Runtime runtime.Runtime
	// Volume is the session's workspace volume
	// (workspace.SessionVolume).
	Volume string
	// Paused: the sandbox is frozen (it uses no CPU).
	Paused bool
}

// Held lists the sandboxes this process holds, running or paused. Like
// SandboxCounts it never waits on a session: it reads what each entry
// published at its last change, so that one session's snapshot or
// hibernation holds up no one's metrics.
func (m *Manager) Held() []SandboxRef {
	m.mu.Lock()
	entries := make([]*entry, 0, len(m.entries))
	for _, e := range m.entries {
		entries = append(entries, e)
	}
	m.mu.Unlock()
	var out []SandboxRef
	for _, e := range entries {
		state := sandbox.SlotState(e.pub.Load())
		sb := e.pubSB.Load()
		if sb == nil || (state != sandbox.SlotRunning && state != sandbox.SlotPaused) {
			continue
		}
		out = append(out, SandboxRef{
			Tenant: e.tenant, Session: e.id, ID: sb.ID, Runtime: sb.Runtime,
			Volume: workspace.SessionVolume(e.tenant, e.id), Paused: state == sandbox.SlotPaused,
		})
	}
	return out
}

// Metrics' sandbox states: the sandbox states of the API, and
// hibernated (no sandbox: the workspace is in the blob store).
const SandboxHibernated = api.StatusHibernated

// SandboxOf returns the tenant's session (ErrNotFound for another
// tenant's), what it has of a sandbox (api.SandboxNone, SandboxStarting,
// SandboxRunning, SandboxPaused, or SandboxHibernated) and, for a running
// or paused one, where to read it: the sandbox this process holds, or,
// when it holds none, the one the record names, which another replica on
// this host started (its cgroups and workspace are this host's too). A
// terminated session has none.
func (m *Manager) SandboxOf(ctx context.Context, tenant, id string) (*Session, string, *SandboxRef, error) {
	s, err := m.Get(ctx, tenant, id)
	if err != nil {
		return nil, "", nil, err
	}
	switch s.Status {
	case api.StatusTerminated:
		return s, api.SandboxNone, nil, nil
	case api.StatusHibernated:
		return s, SandboxHibernated, nil, nil
	}
	ref := &SandboxRef{Tenant: tenant, Session: id, Volume: workspace.SessionVolume(tenant, id)}
	if e := m.peek(key{tenant, id}); e != nil {
		state := sandbox.SlotState(e.pub.Load())
		sb := e.pubSB.Load()
		// With replicas, what this process holds may be older than the
		// record (another replica replaced the sandbox): the record wins.
		if sb != nil && (state == sandbox.SlotRunning || state == sandbox.SlotPaused) && (!m.shared() || sb.ID == s.SandboxID) {
			ref.ID, ref.Runtime, ref.Paused = sb.ID, sb.Runtime, state == sandbox.SlotPaused
			return s, state.String(), ref, nil
		}
		if state == sandbox.SlotStarting {
			return s, api.SandboxStarting, nil, nil
		}
	}
	if s.SandboxID == "" || !m.shared() {
		if s.Status == api.StatusPending {
			return s, api.SandboxStarting, nil, nil
		}
		return s, api.SandboxNone, nil, nil
	}
	spec, err := m.sbx.Spec(ctx, tenant, s.TemplateID)
	if err != nil {
		return nil, "", nil, err
	}
	rt, err := m.sbx.Runtime(spec.Runtime)
	if err != nil {
		return nil, "", nil, err
	}
	ref.ID, ref.Runtime, ref.Paused = s.SandboxID, rt, s.Status == api.StatusPaused
	if ref.Paused {
		return s, api.SandboxPaused, ref, nil
	}
	return s, api.SandboxRunning, ref, nil
}
