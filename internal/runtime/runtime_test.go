package runtime_test

import (
	"context"
	"net"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
)

// core is a runtime with the core methods only, as one of Pods would be
// without the optional capabilities.
type core struct{}

func (core) Create(context.Context, runtime.Spec) (*runtime.Info, error) { return nil, nil }
func (core) Dial(context.Context, string) (net.Conn, error)              { return nil, nil }
func (core) Stop(context.Context, string) error                          { return nil }
func (core) Destroy(context.Context, string) error                       { return nil }
func (core) Inspect(context.Context, string) (*runtime.Info, error)      { return nil, nil }
func (core) List(context.Context) ([]runtime.Info, error)                { return nil, nil }

// boaster declares every capability and implements none.
type boaster struct{ core }

func (boaster) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Stats: true, HostProcesses: true}
}

// A runtime can do what its interfaces say, less what it declares it
// cannot; a declaration never adds what the methods are not there for.
func TestCapabilitiesOf(t *testing.T) {
	none := runtime.Capabilities{}
	if c := runtime.CapabilitiesOf(core{}); c != none {
		t.Errorf("core runtime: %+v, want none", c)
	}
	if c := runtime.CapabilitiesOf(boaster{}); c != none {
		t.Errorf("a runtime declaring what it lacks: %+v, want none", c)
	}
	if _, ok := runtime.PauserOf(boaster{}); ok {
		t.Error("PauserOf of a runtime without Pause")
	}
	f := runtimetest.NewFake()
	if c := runtime.CapabilitiesOf(f); c != (runtime.Capabilities{Pause: true, Stats: true}) {
		t.Errorf("fake: %+v, want pause and stats", c)
	}
	f.Declare(runtime.Capabilities{Stats: true})
	if _, ok := runtime.PauserOf(f); ok {
		t.Error("PauserOf of a fake that declared it cannot pause")
	}
	if _, ok := runtime.StatsReaderOf(f); !ok {
		t.Error("StatsReaderOf of a fake that reads stats")
	}
	if _, ok := runtime.HostProcessesOf(f); ok {
		t.Error("HostProcessesOf of a fake")
	}
}
