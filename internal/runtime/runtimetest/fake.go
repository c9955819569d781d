package runtimetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// Fake is a runtime that keeps sandboxes as states in a map: enough for
// the layers above (sessions, sandboxes), which it lets test without root.
// It creates nothing and dials nothing; Add and Labelled put sandboxes
// there as if something had created them. It can pause and read stats
// unless Declare says otherwise, so that the layers above can be tested
// on a runtime without those capabilities too.
type Fake struct {
	mu     sync.Mutex
	state  map[string]runtime.State
	labels map[string]map[string]string // of sandboxes added with labelled
	stats  map[string]runtime.Stats     // SetStats
	pauses int
	caps   runtime.Capabilities
	calls  map[string]int // of Pause, Resume and Stats, by name
}

// NewFake returns an empty Fake that can pause and read stats.
func NewFake() *Fake {
	return &Fake{state: map[string]runtime.State{}, caps: runtime.Capabilities{Pause: true, Stats: true}, calls: map[string]int{}}
}

var (
	_ runtime.Pauser      = (*Fake)(nil)
	_ runtime.StatsReader = (*Fake)(nil)
	_ runtime.Declarer    = (*Fake)(nil)
)

// Declare sets what the fake says it can do (runtime.CapabilitiesOf).
// A capability declared away is one the layers above must not use: its
// methods still answer, and Calls counts them, so a test can check that
// nothing called them.
func (f *Fake) Declare(c runtime.Capabilities) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.caps = c
}

// Capabilities is what Declare set (Pause and Stats by default).
func (f *Fake) Capabilities() runtime.Capabilities {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.caps
}

// Calls counts the calls of the capability method name: "Pause",
// "Resume" or "Stats".
func (f *Fake) Calls(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *Fake) count(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
}

// Add adds a running sandbox.
func (f *Fake) Add(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[id] = runtime.StateRunning
}

func (f *Fake) Create(ctx context.Context, spec runtime.Spec) (*runtime.Info, error) {
	return nil, errors.New("runtimetest.Fake creates nothing")
}
func (f *Fake) Dial(ctx context.Context, id string) (net.Conn, error) {
	return nil, fmt.Errorf("fake: %w", errdefs.ErrUnavailable)
}
func (f *Fake) set(id string, from, to runtime.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.state[id]; !ok {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound) // as the real runtimes say
	}
	if f.state[id] != from {
		return fmt.Errorf("sandbox %s is %q, not %q: %w", id, f.state[id], from, errdefs.ErrFailedPrecondition)
	}
	f.state[id] = to
	return nil
}
func (f *Fake) Pause(ctx context.Context, id string) error {
	f.count("Pause")
	f.mu.Lock()
	f.pauses++
	f.mu.Unlock()
	return f.set(id, runtime.StateRunning, runtime.StatePaused)
}
func (f *Fake) Resume(ctx context.Context, id string) error {
	f.count("Resume")
	return f.set(id, runtime.StatePaused, runtime.StateRunning)
}
func (f *Fake) Stop(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state[id] = runtime.StateStopped
	return nil
}
func (f *Fake) Destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.state, id)
	return nil
}
func (f *Fake) Inspect(ctx context.Context, id string) (*runtime.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.state[id]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return &runtime.Info{ID: id, State: st}, nil
}
func (f *Fake) Stats(ctx context.Context, id string) (*runtime.Stats, error) {
	f.count("Stats")
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.state[id]; !ok {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	st := f.stats[id]
	if st.Limits == (runtime.Resources{}) {
		st.Limits = runtime.DefaultResources
	}
	return &st, nil
}

// SetStats sets what Stats reports for the sandbox id from now on (zero
// usage and the default limits until then).
func (f *Fake) SetStats(id string, st runtime.Stats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stats == nil {
		f.stats = map[string]runtime.Stats{}
	}
	f.stats[id] = st
}
func (f *Fake) List(ctx context.Context) ([]runtime.Info, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []runtime.Info
	for id, st := range f.state {
		out = append(out, runtime.Info{ID: id, State: st, Labels: f.labels[id]})
	}
	return out, nil
}

// Labelled adds a running sandbox with labels.
func (f *Fake) Labelled(id string, labels map[string]string) {
	f.Add(id)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.labels == nil {
		f.labels = map[string]map[string]string{}
	}
	f.labels[id] = labels
}

// Count counts the sandboxes in state st.
func (f *Fake) Count(st runtime.State) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.state {
		if s == st {
			n++
		}
	}
	return n
}

// Pauses counts the calls of Pause.
func (f *Fake) Pauses() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pauses
}

var _ runtime.Runtime = (*Fake)(nil)

// Len counts the sandboxes, in any state.
func (f *Fake) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.state)
}
