package app

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

// Of replicas sharing a store exactly one runs the reaper and the
// collectors; when it stops, another takes over.
func TestOneLeader(t *testing.T) {
	url := pgtest.URL(t)
	open := func() *App {
		dir := t.TempDir()
		a, err := Open(context.Background(), Config{
			DataDir: dir, StateDir: filepath.Join(dir, "state"), Store: url, WorkspaceQuota: "off",
			ReapInterval: 20 * time.Millisecond, Log: slog.New(slog.DiscardHandler),
			Runtime: func(string) (runtime.Runtime, error) { return nil, fmt.Errorf("none: %w", errdefs.ErrUnavailable) },
		})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
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
