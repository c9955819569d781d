package session

import (
	"errors"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/sandbox"
)

func TestSandboxMoves(t *testing.T) {
	states := []sandboxState{sandboxNone, sandboxStarting, sandboxRunning, sandboxPaused}
	allowed := map[[2]sandboxState]bool{
		{sandboxNone, sandboxStarting}: true, {sandboxNone, sandboxRunning}: true, {sandboxNone, sandboxPaused}: true,
		{sandboxStarting, sandboxRunning}: true,
		{sandboxRunning, sandboxPaused}:   true, {sandboxPaused, sandboxRunning}: true,
	}
	sb, st := &sandbox.Sandbox{ID: "x"}, &startOp{}
	for _, from := range states {
		for _, to := range states {
			e := &entry{key: key{"t", "s"}}
			// Get to from by allowed moves.
			switch from {
			case sandboxStarting:
				e.moveSandbox(sandboxStarting, nil, st)
			case sandboxRunning, sandboxPaused:
				e.moveSandbox(from, sb, nil)
			}
			if e.sbState != from {
				t.Fatalf("could not reach %s", from)
			}
			err := e.moveSandbox(to, sb, st)
			want := allowed[[2]sandboxState{from, to}] || to == sandboxNone || to == from && to != sandboxStarting
			if (err == nil) != want {
				t.Errorf("%s -> %s: %v, want allowed %v", from, to, err, want)
			}
			if err != nil && !errors.As(err, new(*sandboxMoveError)) {
				t.Errorf("%s -> %s: %T", from, to, err)
			}
			// The data follows the state.
			if (e.sb != nil) != (e.sbState == sandboxRunning || e.sbState == sandboxPaused) || (e.start != nil) != (e.sbState == sandboxStarting) {
				t.Errorf("%s -> %s: state %s with sb %v, start %v", from, to, e.sbState, e.sb, e.start)
			}
		}
	}
	// Running without a sandbox is refused.
	if err := (&entry{}).moveSandbox(sandboxRunning, nil, nil); err == nil {
		t.Error("running with no sandbox")
	}
}
