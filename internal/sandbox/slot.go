package sandbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/sbx-sandbox/sbx/api"
)

// Slot is what one process holds of one session's sandbox, with a state
// machine of its own, apart from the session's: the session's record says
// which sandbox the session has; the slot says what this process does with
// it. The caller serializes every call (the session's entry lock).
//
//	none --start--> starting --started--> running <--thaw/freeze--> paused
//	  |               |                     |                          |
//	  +--adopt, warm pool--> running/paused |                          |
//	  ^---------------- failed, deleted ----+-- destroyed, lost, let go+
type Slot struct {
	// Owner names the slot's session in errors.
	Owner string

	state SlotState
	sb    *Sandbox // running, paused
	start *Start   // starting
}

// SlotState is where a slot is.
type SlotState int32

const (
	// SlotNone: this process holds no sandbox for the session (another
	// replica may: the session layer adopts it).
	SlotNone SlotState = iota
	// SlotStarting: a start is in flight (Slot.Start).
	SlotStarting
	// SlotRunning: the sandbox is up and thawed; executions lease it.
	SlotRunning
	// SlotPaused: the sandbox is frozen.
	SlotPaused
)

// String is the state as the API says it (sandbox_state).
func (s SlotState) String() string {
	return [...]string{api.SandboxNone, api.SandboxStarting, api.SandboxRunning, api.SandboxPaused}[s]
}

// slotMoves are the moves the state machine allows; going back to none is
// always allowed, and staying where it is but for starting.
var slotMoves = map[SlotState][]SlotState{
	SlotNone:     {SlotStarting, SlotRunning, SlotPaused},
	SlotStarting: {SlotRunning},
	SlotRunning:  {SlotPaused},
	SlotPaused:   {SlotRunning},
}

// Start is a start in flight: Done closes when it is over, with Err its
// failure; Cancel gives it up.
type Start struct {
	Done   chan struct{}
	Cancel context.CancelFunc
	Err    error
}

// NewStart returns a start that cancel gives up.
func NewStart(cancel context.CancelFunc) *Start {
	return &Start{Done: make(chan struct{}), Cancel: cancel}
}

// MoveError is a move the state machine does not allow: a bug in sbx,
// never a caller's doing.
type MoveError struct {
	Owner    string
	From, To SlotState
}

func (e *MoveError) Error() string {
	return fmt.Sprintf("session %q: its sandbox cannot go from %s to %s (a bug in sbx)", e.Owner, e.From, e.To)
}

// Move moves the slot to state to: with sb for running and paused (nil
// keeps the one held), with st for starting.
func (s *Slot) Move(to SlotState, sb *Sandbox, st *Start) error {
	same := to == s.state && to != SlotStarting // one start at a time
	if to != SlotNone && !same && !slices.Contains(slotMoves[s.state], to) {
		return &MoveError{Owner: s.Owner, From: s.state, To: to}
	}
	switch to {
	case SlotNone:
		s.sb, s.start = nil, nil
	case SlotStarting:
		s.sb, s.start = nil, st
	default:
		if sb != nil {
			s.sb = sb
		}
		if s.sb == nil {
			return &MoveError{Owner: s.Owner, From: s.state, To: to}
		}
		s.start = nil
	}
	s.state = to
	return nil
}

// Drop lets the held sandbox go (none) and returns it, nil if there was
// none.
func (s *Slot) Drop() *Sandbox {
	sb := s.sb
	s.Move(SlotNone, nil, nil) // always allowed
	return sb
}

// Held returns the sandbox held, running or paused, or nil.
func (s *Slot) Held() *Sandbox {
	if s.state == SlotRunning || s.state == SlotPaused {
		return s.sb
	}
	return nil
}

// State is where the slot is.
func (s *Slot) State() SlotState { return s.state }

// Starting returns the start in flight, or nil.
func (s *Slot) Starting() *Start { return s.start }
