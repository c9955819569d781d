package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

var manyFiles = flag.Int("many-files", 999_000, "empty files in the workspace that -only manyfiles hibernates and restores (the snapshot limit is 1,000,000 entries)")

// benchManyFiles hibernates and restores a workspace of many empty files,
// the shape sandboxed code can give its workspace at no cost in bytes, and
// reports how much the server's memory peaked above where it was: the
// manifest streams, so it must not grow with the number of files.
func benchManyFiles(ctx context.Context, add func(row)) {
	noRuntime := func(string) (runtime.Runtime, error) {
		return nil, fmt.Errorf("many files only: %w", errdefs.ErrUnavailable)
	}
	cp := startControlPlane(filepath.Join(*dataDir, "bench-many"), noRuntime)
	defer cp.stop()
	const sid = "many"
	// Empty files cost metadata only, about 400 bytes each on btrfs.
	disk := int64(*manyFiles)/1000 + 256
	if _, _, err := cp.c.CreateSession(ctx, api.CreateSessionRequest{SessionID: sid, Resources: &api.Resources{Disk: disk}}); err != nil {
		log.Fatal(err)
	}
	ws := filepath.Join(cp.dir, "workspaces", "default", sid)
	t0 := time.Now()
	for i := 0; i < *manyFiles; i++ {
		dir := filepath.Join(ws, "d"+strconv.Itoa(i/1000))
		if i%1000 == 0 {
			if err := os.Mkdir(dir, 0o755); err != nil {
				log.Fatal(err)
			}
		}
		f, err := os.Create(filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			log.Fatal(err)
		}
		f.Close()
	}
	log.Printf("bench: made %d files in %v", *manyFiles, time.Since(t0).Round(time.Millisecond))
	base := rssBytes()
	resetPeak()
	t0 = time.Now()
	if _, err := cp.c.HibernateSession(ctx, sid); err != nil {
		log.Fatal(err)
	}
	hib := time.Since(t0)
	hibPeak := peakBytes()
	resetPeak()
	t0 = time.Now()
	// A file call restores the workspace.
	if _, err := cp.c.ListFiles(ctx, sid, client.ListFilesOptions{Path: "d0"}); err != nil {
		log.Fatal(err)
	}
	res := time.Since(t0)
	resPeak := peakBytes()
	n := fmt.Sprintf("%d files", *manyFiles)
	add(row{name: "(m) HTTP hibernate a workspace of " + n, p50: hib})
	add(row{name: "    server memory peak above its RSS before, hibernating", mem: max(hibPeak-min(hibPeak, base), 1), goal: "flat in the file count",
		vs: fmt.Sprintf("RSS before %.0f MB", float64(base)/(1<<20))})
	add(row{name: "    HTTP restore it (file call)", p50: res})
	add(row{name: "    server memory peak above its RSS before, restoring", mem: max(resPeak-min(resPeak, base), 1), goal: "flat in the file count"})
	if _, err := cp.c.DeleteSession(ctx, sid); err != nil {
		log.Printf("deleting %s: %v", sid, err)
	}
}

// resetPeak resets the process's peak resident memory (VmHWM) to what it
// uses now.
func resetPeak() {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		log.Printf("bench: resetting the peak RSS: %v", err)
	}
}

// peakBytes is the process's peak resident memory since resetPeak.
func peakBytes() uint64 { return statusBytes("VmHWM:") }
