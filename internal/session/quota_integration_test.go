//go:build integration

package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/quota/quotatest"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// quotaCases run a benchmark without quotas and with btrfs ones, on the
// same machine, so that the cost of R-72 is the difference.
func quotaCases(b *testing.B, run func(b *testing.B, configure func(*Options))) {
	b.Run("none", func(b *testing.B) { run(b, func(*Options) {}) })
	b.Run("btrfs", func(b *testing.B) {
		q, root := quotatest.Mount(b)
		run(b, func(o *Options) { o.Quota, o.WorkspaceDir = q, root })
	})
}

// BenchmarkCreateSession is a lazy session's create: record and
// workspace (a directory, or a subvolume with its limit).
func BenchmarkCreateSession(b *testing.B) {
	quotaCases(b, func(b *testing.B, configure func(*Options)) {
		m := newManager(b, runtimetest.NewFake(), configure)
		ctx := context.Background()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, _, err := m.Create(ctx, "t", CreateRequest{ID: fmt.Sprint("s", i), Resources: Resources{DiskMB: 100}}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkClaimMove is the file work of a warm-pool claim: a session's
// workspace with an upload moves into a pooled one.
func BenchmarkClaimMove(b *testing.B) {
	quotaCases(b, func(b *testing.B, configure func(*Options)) {
		m := newManager(b, runtimetest.NewFake(), configure)
		ctx := context.Background()
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			pool, ws := workspace.PoolVolume(fmt.Sprint("p", i)), workspace.SessionVolume("t", fmt.Sprint("s", i))
			for _, v := range []string{pool, ws} {
				if err := m.ws.Create(ctx, v, 100); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(m.opt.WorkspaceDir, ws, "data.csv"), make([]byte, 64<<10), 0o644); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := m.ws.Claim(ctx, pool, ws); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// A claim copies across quotas; the session's quota must hold on what it
// moved: the moved bytes count against the pooled directory's limit.
func TestClaimMoveKeepsQuota(t *testing.T) {
	q, root := quotatest.Mount(t)
	m := newManager(t, runtimetest.NewFake(), func(o *Options) { o.Quota, o.WorkspaceDir = q, root })
	ctx := context.Background()
	pool, vol := workspace.PoolVolume("pool"), workspace.SessionVolume("t", "ws")
	for _, v := range []string{pool, vol} {
		if err := m.ws.Create(ctx, v, 16); err != nil {
			t.Fatal(err)
		}
	}
	ws := filepath.Join(root, vol)
	if err := os.WriteFile(filepath.Join(ws, "big"), make([]byte, 12<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.ws.Claim(ctx, pool, vol); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ws, "big")); err != nil {
		t.Fatal(err)
	}
	err := os.WriteFile(filepath.Join(ws, "more"), make([]byte, 8<<20), 0o644)
	if err == nil {
		t.Fatal("wrote 12+8 MiB into a 16 MiB workspace after a claim")
	}
}
