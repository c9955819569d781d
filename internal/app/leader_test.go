package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

// openReplica opens a server on the store at url, with a data directory
// of its own and no sandbox runtime.
func openReplica(t *testing.T, url string, reapInterval time.Duration) *App {
	t.Helper()
	dir := t.TempDir()
	a, err := Open(context.Background(), Config{
		DataDir: dir, StateDir: filepath.Join(dir, "state"), Store: url, WorkspaceQuota: "off",
		ReapInterval: reapInterval, Log: slog.New(slog.DiscardHandler),
		Runtime: func(string) (runtime.Runtime, error) { return nil, fmt.Errorf("none: %w", errdefs.ErrUnavailable) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close) // before pgtest drops the database, on failures too
	return a
}

// Of replicas sharing a store exactly one runs the reaper and the
// collectors; when it stops, another takes over.
func TestOneLeader(t *testing.T) {
	url := pgtest.URL(t)
	open := func() *App { return openReplica(t, url, 20*time.Millisecond) }
	apps := []*App{open(), open(), open()}
	token := func(a *App) int64 {
		a.leader.mu.Lock()
		defer a.leader.mu.Unlock()
		return a.leader.token
	}
	// leaders waits until exactly one app leads, and returns it.
	leaders := func(apps []*App) (*App, int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			var lead []*App
			for _, a := range apps {
				if token(a) != 0 {
					lead = append(lead, a)
				}
			}
			if len(lead) > 1 {
				t.Fatalf("%d replicas lead at once", len(lead))
			}
			if len(lead) == 1 {
				return lead[0], token(lead[0])
			}
			if time.Now().After(deadline) {
				t.Fatal("no replica leads")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	first, tok := leaders(apps)
	// Held over many renewals, by the same one.
	time.Sleep(200 * time.Millisecond)
	if again, tok2 := leaders(apps); again != first || tok2 != tok {
		t.Errorf("the lead moved (token %d -> %d) while its holder lived", tok, tok2)
	}
	var rest []*App
	for _, a := range apps {
		if a != first {
			rest = append(rest, a)
		}
	}
	first.Close()
	_, tok3 := leaders(rest)
	if tok3 <= tok {
		t.Errorf("the next leader's token %d is not past %d", tok3, tok)
	}
	for _, a := range rest {
		a.Close()
	}
}

// A replica that starts fails the executions of servers that are gone (a
// previous process, one that died), never those of a live replica; when a
// replica stops, the one running the reaper fails what it left.
func TestExecutionsOfGoneReplicas(t *testing.T) {
	url := pgtest.URL(t)
	open := func() *App { return openReplica(t, url, 0) }
	ctx := context.Background()
	a := open()
	running := func(id, owner string) {
		t.Helper()
		if err := a.Store.CreateExecution(ctx, &store.Execution{
			Tenant: "default", ID: id, SessionID: "s", Status: api.ExecRunning, Language: "python",
			Request: json.RawMessage(`{"code":"1"}`), CreatedAt: time.Now(), StartedAt: time.Now(), Owner: owner,
		}); err != nil {
			t.Fatal(err)
		}
	}
	running("x-a", a.replica)
	running("x-gone", "some-host/1234/deadbeef")
	running("x-old", "")
	status := func(id string) string {
		t.Helper()
		x, err := a.Store.GetExecution(ctx, "default", id)
		if err != nil {
			t.Fatal(err)
		}
		return x.Status
	}
	b := open()
	defer b.Close()
	for id, want := range map[string]string{"x-a": api.ExecRunning, "x-gone": api.ExecFailed, "x-old": api.ExecFailed} {
		if got := status(id); got != want {
			t.Errorf("%s after another replica started: %s, want %s", id, got, want)
		}
	}
	st := b.Store
	a.Close() // its executions are its own to finish, but this one was made by hand
	deadline := time.Now().Add(30 * time.Second)
	for {
		x, err := st.GetExecution(ctx, "default", "x-a")
		if err != nil {
			t.Fatal(err)
		}
		if x.Status == api.ExecFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the execution of a stopped replica is still running 30 s later")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
