package app_test

import (
	"testing"

	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/session"
)

// Every tenant's default limits come from the machine: a laptop and a
// large server both get bounds that fit them, and none is left unbounded
// but by a machine that cannot say.
func TestDefaultLimits(t *testing.T) {
	fixed := session.Limits{Sessions: 10000, History: 1000, HistoryMB: 1024, Snapshots: 32, StoredMB: 20 << 10, Streams: 64, Chats: 8}
	with := func(l session.Limits) session.Limits {
		l.Sessions, l.History, l.HistoryMB, l.Snapshots, l.StoredMB = fixed.Sessions, fixed.History, fixed.HistoryMB, fixed.Snapshots, fixed.StoredMB
		l.Streams, l.Chats = fixed.Streams, fixed.Chats
		return l
	}
	for _, tc := range []struct {
		name       string
		m          app.Machine
		overcommit float64
		want       session.Limits
	}{
		{"laptop", app.Machine{CPUs: 8, MemoryMB: 16 << 10, WorkspaceMB: 64 << 10}, 1,
			with(session.Limits{Sandboxes: 64, MemoryMB: 12 << 10, CPU: 32, DiskMB: 64 << 10})},
		{"this kind of VM", app.Machine{CPUs: 2, MemoryMB: 24105, WorkspaceMB: 65536}, 1,
			with(session.Limits{Sandboxes: 94, MemoryMB: 18078, CPU: 8, DiskMB: 65536})},
		{"large server, disk overcommitted", app.Machine{CPUs: 64, MemoryMB: 512 << 10, WorkspaceMB: 2 << 20}, 2.5,
			with(session.Limits{Sandboxes: 2048, MemoryMB: 384 << 10, CPU: 256, DiskMB: 5 << 20})},
		{"tiny", app.Machine{CPUs: 1, MemoryMB: 512, WorkspaceMB: 1024}, 1,
			with(session.Limits{Sandboxes: 4, MemoryMB: 384, CPU: 4, DiskMB: 1024})},
		{"no disk bound asked", app.Machine{CPUs: 1, MemoryMB: 1024, WorkspaceMB: 1024}, 0,
			with(session.Limits{Sandboxes: 4, MemoryMB: 768, CPU: 4})},
	} {
		if got := app.DefaultLimits(tc.m, tc.overcommit); got != tc.want {
			t.Errorf("%s: DefaultLimits(%+v, %v) =\n%+v, want\n%+v", tc.name, tc.m, tc.overcommit, got, tc.want)
		}
	}
	if m := app.ThisMachine(); m.CPUs < 1 || m.MemoryMB < 64 {
		t.Errorf("ThisMachine() = %+v", m)
	}
}
