package sqlite_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/store"
)

func benchSession(i int, now time.Time) *store.Session {
	return &store.Session{
		Tenant: "tenant-1", ID: fmt.Sprintf("sess-%08d", i), Status: "pending", TemplateID: "python",
		Metadata:  map[string]string{"user_id": fmt.Sprintf("user-%d", i%100), "agent_id": fmt.Sprintf("agent-%d", i%7)},
		Config:    json.RawMessage(`{"ttl":3600,"resources":{"cpu":1,"memory":512},"env":["A","B"]}`),
		CreatedAt: now, UpdatedAt: now, LastActivityAt: now, ExpiresAt: now.Add(time.Hour),
	}
}

func BenchmarkCreateSession(b *testing.B) {
	s, ctx, now := open(b), context.Background(), time.Now()
	i := 0
	for b.Loop() {
		if err := s.CreateSession(ctx, benchSession(i, now)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkGetSession(b *testing.B) {
	s, ctx := open(b), context.Background()
	const n = 10000
	seed(b, s, n)
	i := 0
	for b.Loop() {
		if _, err := s.GetSession(ctx, "tenant-1", fmt.Sprintf("sess-%08d", i%n)); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkGetSessionParallel(b *testing.B) {
	s, ctx := open(b), context.Background()
	const n = 10000
	seed(b, s, n)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := s.GetSession(ctx, "tenant-1", fmt.Sprintf("sess-%08d", i%n)); err != nil {
				b.Error(err)
				return
			}
			i += 7
		}
	})
}

// BenchmarkUpdateSession is the write the control plane makes most: a
// session's activity time, about once a second per busy session.
func BenchmarkUpdateSession(b *testing.B) {
	s, ctx := open(b), context.Background()
	const n = 1000
	seed(b, s, n)
	sess, err := s.GetSession(ctx, "tenant-1", "sess-00000001")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		sess.LastActivityAt = time.Now()
		if err := s.UpdateSession(ctx, sess); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCreateUpdateExecution(b *testing.B) {
	s, ctx := open(b), context.Background()
	req := json.RawMessage(`{"code":"print('hello')","language":"python","timeout_ms":30000}`)
	res := json.RawMessage(`{"status":"completed","stdout":"hello\n","exit_code":0,"duration_ms":12}`)
	i := 0
	for b.Loop() {
		now := time.Now()
		x := &store.Execution{Tenant: "tenant-1", ID: fmt.Sprintf("exec-%08d", i), SessionID: "sess-1", Status: "pending",
			Language: "python", Request: req, CreatedAt: now}
		if err := s.CreateExecution(ctx, x); err != nil {
			b.Fatal(err)
		}
		x.Status, x.StartedAt, x.FinishedAt, x.Result = "completed", now, now, res
		if err := s.UpdateExecution(ctx, x); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkListSessions lists the first page of 10,000 sessions in one
// tenant, all of them and filtered.
func BenchmarkListSessions(b *testing.B) {
	s, ctx := open(b), context.Background()
	seed(b, s, 10000)
	for _, bc := range []struct {
		name string
		f    store.SessionFilter
	}{
		{"all", store.SessionFilter{}},
		{"status", store.SessionFilter{Status: "running"}},
		{"user", store.SessionFilter{Metadata: map[string]string{"user_id": "user-42"}}},
		{"agent", store.SessionFilter{Metadata: map[string]string{"agent_id": "agent-3"}}},
		{"user+agent", store.SessionFilter{Metadata: map[string]string{"user_id": "user-42", "agent_id": "agent-3"}}},
		{"rare", store.SessionFilter{Metadata: map[string]string{"user_id": "user-42", "agent_id": "agent-none"}}},
		{"status+user", store.SessionFilter{Status: "running", Metadata: map[string]string{"user_id": "user-42"}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := bc.f
			f.Tenant = "tenant-1"
			for b.Loop() {
				if _, _, err := s.ListSessions(ctx, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("all pages", func(b *testing.B) {
		for b.Loop() {
			f := store.SessionFilter{Tenant: "tenant-1", Limit: 1000}
			n := 0
			for {
				list, next, err := s.ListSessions(ctx, f)
				if err != nil {
					b.Fatal(err)
				}
				n += len(list)
				if next == "" {
					break
				}
				f.PageToken = next
			}
			if n != 10000 {
				b.Fatalf("listed %d", n)
			}
		}
	})
}

// seed creates n sessions, a tenth of them running, with metadata
// user_id (100 values) and agent_id (7 values), and others in another
// tenant.
func seed(b *testing.B, s store.Store, n int) {
	b.Helper()
	ctx, base := context.Background(), time.Now().Add(-time.Hour)
	for i := range n {
		sess := benchSession(i, base.Add(time.Duration(i)*time.Millisecond))
		if i%10 == 0 {
			sess.Status = "running"
		}
		if err := s.CreateSession(ctx, sess); err != nil {
			b.Fatal(err)
		}
		sess.Tenant = "tenant-2"
		if err := s.CreateSession(ctx, sess); err != nil {
			b.Fatal(err)
		}
	}
}
