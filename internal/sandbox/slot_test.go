package sandbox

import (
	"errors"
	"testing"
)

func TestSlotMoves(t *testing.T) {
	states := []SlotState{SlotNone, SlotStarting, SlotRunning, SlotPaused}
	allowed := map[[2]SlotState]bool{
		{SlotNone, SlotStarting}: true, {SlotNone, SlotRunning}: true, {SlotNone, SlotPaused}: true,
		{SlotStarting, SlotRunning}: true,
		{SlotRunning, SlotPaused}:   true, {SlotPaused, SlotRunning}: true,
	}
	sb, st := &Sandbox{ID: "x"}, NewStart(func() {})
	for _, from := range states {
		for _, to := range states {
			s := &Slot{Owner: "s"}
			// Get to from by allowed moves.
			switch from {
			case SlotStarting:
				s.Move(SlotStarting, nil, st)
			case SlotRunning, SlotPaused:
				s.Move(from, sb, nil)
			}
			if s.State() != from {
				t.Fatalf("could not reach %s", from)
			}
			err := s.Move(to, sb, st)
			want := allowed[[2]SlotState{from, to}] || to == SlotNone || to == from && to != SlotStarting
			if (err == nil) != want {
				t.Errorf("%s -> %s: %v, want allowed %v", from, to, err, want)
			}
			if err != nil && !errors.As(err, new(*MoveError)) {
				t.Errorf("%s -> %s: %T", from, to, err)
			}
			// The data follows the state.
			if (s.Held() != nil) != (s.State() == SlotRunning || s.State() == SlotPaused) || (s.Starting() != nil) != (s.State() == SlotStarting) {
				t.Errorf("%s -> %s: state %s with sb %v, start %v", from, to, s.State(), s.Held(), s.Starting())
			}
		}
	}
	// Running without a sandbox is refused.
	if err := (&Slot{}).Move(SlotRunning, nil, nil); err == nil {
		t.Error("running with no sandbox")
	}
	if sb := (&Slot{}).Drop(); sb != nil {
		t.Error("an empty slot dropped a sandbox")
	}
}
