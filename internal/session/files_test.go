package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
)

// max_file_count holds against writes that come at once, as a hostile
// client sends them: of many writes racing for the last slots, no more
// succeed than there are slots, and the records agree with the writes
// that succeeded.
// Replacing a recorded file takes no slot; a refused or failed write
// leaves no record behind.
func TestMaxFileCountUnderConcurrency(t *testing.T) {
	m := newManager(t, runtimetest.NewFake())
	ctx := context.Background()
	const limit = 3
	if _, _, err := m.Create(ctx, "t", api.CreateSessionRequest{SessionID: "s",
		FileUploadConfig: &api.FileUploadConfig{MaxFileCount: limit}}); err != nil {
		t.Fatal(err)
	}
	write := func(p string) error {
		_, f, err := m.Workspace(ctx, "t", "s")
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = f.Write(ctx, FileWrite{Path: p, Body: strings.NewReader("x")})
		return err
	}
	for round := range 5 {
		var wg sync.WaitGroup
		errs := make([]error, 16)
		start := make(chan struct{})
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs[i] = write(fmt.Sprintf("r%d/f%d.txt", round, i))
			}()
		}
		close(start)
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, errdefs.ErrFailedPrecondition):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		n, err := m.opt.Store.CountUploads(ctx, "t", "s")
		if err != nil {
			t.Fatal(err)
		}
		if ok > limit || n != ok {
			t.Fatalf("round %d: %d writes succeeded and %d are recorded; max_file_count is %d", round, ok, n, limit)
		}
		// Free the slots for the next round. (Writes racing for the
		// slots may all have been refused: then there is nothing.)
		_, f, err := m.Workspace(ctx, "t", "s")
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Remove(ctx, fmt.Sprintf("r%d", round), true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatal(err)
		}
		f.Close()
	}
	// At the limit, a recorded file may be replaced, and a new one not.
	for i := range limit {
		if err := write(fmt.Sprintf("keep%d.txt", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := write("keep0.txt"); err != nil {
		t.Fatalf("replacing a recorded file at the limit: %v", err)
	}
	if err := write("one-more.txt"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("one file past the limit: %v", err)
	}
	if n, err := m.opt.Store.CountUploads(ctx, "t", "s"); err != nil || n != limit {
		t.Fatalf("records after a refused write: %d, %v; want %d", n, err, limit)
	}
}
