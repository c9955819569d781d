package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"path/filepath"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

var resourceCount = flag.Int("resources", 200, "resources (4 KiB skills) for the resource-sync measure")

// benchResources measures resource sync over HTTP against a GET of
// the session in the same process: an unchanged manifest should cost about
// one small request, a changed resource one more round.
func benchResources(ctx context.Context, add func(row)) {
	noRuntime := func(string) (runtime.Runtime, error) {
		return nil, fmt.Errorf("resources only: %w", errdefs.ErrUnavailable)
	}
	cp := startControlPlane(filepath.Join(*dataDir, "bench-resources"), noRuntime)
	defer cp.stop()
	for _, id := range []string{"res-1", "res-2"} {
		if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: id}); err != nil {
			log.Fatal(err)
		}
	}
	skills := map[string][]byte{}
	for i := range *resourceCount {
		b := make([]byte, 4096)
		copy(b, fmt.Sprintf("# skill %d\n", i))
		skills[fmt.Sprintf("skills/s%03d/SKILL.md", i)] = b
	}
	t0 := time.Now()
	first, err := cp.c.SyncResources(ctx, "res-1", skills)
	if err != nil {
		log.Fatal(err)
	}
	firstTook := time.Since(t0)
	get := measure(200, func() {
		if _, err := cp.c.GetSession(ctx, "res-1"); err != nil {
			log.Fatal(err)
		}
	})
	same := measure(200, func() {
		if r, err := cp.c.SyncResources(ctx, "res-1", skills); err != nil || r.Requests != 1 {
			log.Fatalf("unchanged sync: %v %+v", err, r)
		}
	})
	i := 0
	changed := measure(50, func() {
		i++
		skills["skills/s007/SKILL.md"] = fmt.Appendf(nil, "# skill 7, version %d\n", i)
		if r, err := cp.c.SyncResources(ctx, "res-1", skills); err != nil || len(r.Uploaded) != 1 {
			log.Fatalf("changed sync: %v %+v", err, r)
		}
	})
	t0 = time.Now()
	other, err := cp.c.SyncResources(ctx, "res-2", skills)
	if err != nil || len(other.Uploaded) != 0 {
		log.Fatalf("second session: %v %+v", err, other)
	}
	otherTook := time.Since(t0)
	n := *resourceCount
	add(row{name: fmt.Sprintf("(i) resource sync, %d x 4 KiB, first (%d requests)", n, first.Requests), p50: firstTook})
	add(row{name: "    unchanged manifest (1 request)", p50: same.p(50), p99: same.p(99), goal: "~ one small request",
		vs: ratio(same.p(50), get.p(50), "GET session")})
	add(row{name: "    one resource changed (3 requests, 1 upload)", p50: changed.p(50), p99: changed.p(99)})
	add(row{name: "    same set into a second session (copies from the blob store, no upload)", p50: otherTook})
}
