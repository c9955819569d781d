package session

import (
	"fmt"
	"slices"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/sandbox"
)

// sandboxState is what this process holds of a session's sandbox: its
// own state machine, apart from the session's (state.go). The record says
// which sandbox the session has; the entry says what this process does
// with it.
//
//	none --kick--> starting --started--> running <--thaw/freeze--> paused
//	  |               |                     |                          |
//	  +--adopt, warm pool--> running/paused |                          |
//	  ^---------------- failed, deleted ----+-- destroyed, lost, let go+
type sandboxState int32

const (
	// sandboxNone: this process holds no sandbox for the session (another
	// replica may: sync adopts it).
	sandboxNone sandboxState = iota
	// sandboxStarting: a start is in flight (entry.start).
	sandboxStarting
	// sandboxRunning: entry.sb is up and thawed; executions lease it.
	sandboxRunning
	// sandboxPaused: entry.sb is frozen.
	sandboxPaused
)

// String is the state as the API says it (sandbox_state).
func (s sandboxState) String() string {
	return [...]string{api.SandboxNone, api.SandboxStarting, api.SandboxRunning, api.SandboxPaused}[s]
}

// sandboxMoves are the moves the state machine allows; going back to
// none is always allowed, and staying where it is but for starting.
var sandboxMoves = map[sandboxState][]sandboxState{
	sandboxNone:     {sandboxStarting, sandboxRunning, sandboxPaused},
	sandboxStarting: {sandboxRunning},
	sandboxRunning:  {sandboxPaused},
	sandboxPaused:   {sandboxRunning},
}

// sandboxMoveError is a move the sandbox's state machine does not allow:
// a bug in this package, never a caller's doing.
type sandboxMoveError struct {
	session  string
	from, to sandboxState
}

func (e *sandboxMoveError) Error() string {
	return fmt.Sprintf("session %q: its sandbox cannot go from %s to %s (a bug in sbx)", e.session, e.from, e.to)
}

// moveSandbox moves the entry's sandbox to state to: with sb for running
// and paused (nil keeps the one held), with st for starting. The caller
// holds e.mu.
func (e *entry) moveSandbox(to sandboxState, sb *sandbox.Sandbox, st *startOp) error {
	same := to == e.sbState && to != sandboxStarting // one start at a time
	if to != sandboxNone && !same && !slices.Contains(sandboxMoves[e.sbState], to) {
		return &sandboxMoveError{session: e.id, from: e.sbState, to: to}
	}
	switch to {
	case sandboxNone:
		e.sb, e.start = nil, nil
	case sandboxStarting:
		e.sb, e.start = nil, st
	default:
		if sb != nil {
			e.sb = sb
		}
		if e.sb == nil {
			return &sandboxMoveError{session: e.id, from: e.sbState, to: to}
		}
		e.start = nil
	}
	e.sbState = to
	return nil
}

// drop lets the held sandbox go (none) and returns it, nil if there was
// none. The caller holds e.mu.
func (e *entry) drop() *sandbox.Sandbox {
	sb := e.sb
	e.moveSandbox(sandboxNone, nil, nil) // always allowed
	return sb
}

// held returns the sandbox held, running or paused, or nil.
func (e *entry) held() *sandbox.Sandbox {
	if e.sbState == sandboxRunning || e.sbState == sandboxPaused {
		return e.sb
	}
	return nil
}
