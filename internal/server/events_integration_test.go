//go:build integration

package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
)

// A session's life with a real sandbox, as its events tell it: the
// tenant's stream has every change in order with what it did, and a
// webhook got the same events, signed, each once, in the same order.
func TestEventsAndWebhooks(t *testing.T) {
	rs := startReal(t, t.TempDir(), withEvents)
	c := client.New(rs.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rc := newHookReceiver(t)
	h, err := c.CreateWebhook(ctx, api.WebhookRequest{URL: rc.URL})
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	rc.secret = h.Secret
	rc.mu.Unlock()
	stream, err := c.Events(ctx, client.EventsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()

	const sid = "evreal"
	newSession(t, c, api.CreateSessionRequest{SessionID: sid, TemplateID: "python"})
	execOK(t, c, sid, api.ExecuteRequest{Code: "print(1)"})
	if _, err := c.PauseSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResumeSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if _, err := c.HibernateSession(ctx, sid); err != nil {
		t.Fatal(err)
	}
	// Restores it; fails with exit status 3.
	if x, err := c.Execute(ctx, sid, api.ExecuteRequest{Code: "exit 3", Language: "bash"}); err != nil || x.ExitCode == nil || *x.ExitCode != 3 {
		t.Fatalf("exit 3: %+v %v", x, err)
	}
	if _, err := c.DeleteSession(ctx, sid); err != nil {
		t.Fatal(err)
	}

	want := []string{
		api.EventWebhookCreated,
		api.EventSessionCreated, api.EventSessionStarting, api.EventSessionRunning,
		api.EventExecutionStarted, api.EventExecutionFinished,
		api.EventSessionPaused, api.EventSessionResumed, api.EventSessionHibernated,
		api.EventSessionRestored, api.EventSessionStarting, api.EventSessionRunning,
		api.EventExecutionStarted, api.EventExecutionFinished,
		api.EventSessionTerminated,
	}
	var got []api.Event
	for len(got) < len(want) {
		ev, err := stream.Next()
		if err != nil {
			t.Fatalf("after %v: %v", typesOf(got), err)
		}
		got = append(got, *ev)
	}
	if !slices.Equal(typesOf(got), want) {
		t.Fatalf("stream: %v\nwant    %v", typesOf(got), want)
	}
	for i, e := range got {
		if e.ID != int64(i+1) {
			t.Errorf("event %d has id %d", i, e.ID)
		}
	}
	byType := func(typ string, nth int) api.EventData {
		for _, e := range got {
			if e.Type == typ {
				if nth == 0 {
					return e.Data
				}
				nth--
			}
		}
		return api.EventData{}
	}
	if d := byType(api.EventSessionRunning, 0); d.SandboxID == "" || d.Status != api.StatusRunning {
		t.Errorf("session.running: %+v", d)
	}
	if d := byType(api.EventExecutionFinished, 0); d.Status != api.ExecCompleted || d.ExitCode == nil || *d.ExitCode != 0 || d.DurationMs == nil || d.ExecutionID == "" {
		t.Errorf("first execution.finished: %+v", d)
	}
	if d := byType(api.EventExecutionFinished, 1); d.ExitCode == nil || *d.ExitCode != 3 || d.Language != "bash" {
		t.Errorf("second execution.finished: %+v", d)
	}
	if d := byType(api.EventSessionPaused, 0); d.Reason != "request" || d.Status != api.StatusPaused || d.SandboxID == "" {
		t.Errorf("session.paused: %+v", d)
	}
	if d := byType(api.EventSessionHibernated, 0); d.Reason != "request" || d.SandboxID != "" {
		t.Errorf("session.hibernated: %+v", d)
	}

	// The webhook: the same events after its own, each once, signed.
	deadline := time.Now().Add(time.Minute)
	var hooked []api.Event
	for len(hooked) < len(want)-1 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		hooked, _ = rc.events()
	}
	if _, errs := rc.events(); len(errs) > 0 {
		t.Errorf("deliveries that did not verify: %v", errs)
	}
	if !slices.Equal(typesOf(hooked), want[1:]) {
		t.Errorf("webhook got %v\nwant        %v", typesOf(hooked), want[1:])
	}
	for i, e := range hooked {
		if e.ID != got[i+1].ID {
			t.Errorf("webhook event %d: id %d, the stream's %d", i, e.ID, got[i+1].ID)
		}
	}
}
