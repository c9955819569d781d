package executor

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// BenchmarkRunPython is the round trip of print(1) through the client:
// request, hand-off to a zygote worker, run, result. It reports the median
// and 90th percentile besides the mean.
func BenchmarkRunPython(b *testing.B) {
	benchRun(b, py("print(1)"), 0)
}

// BenchmarkRunPythonPaced leaves the executor 50 ms between runs (not
// timed), as an agent's steps do: the zygote has replaced the worker the
// previous run used by the time the next one comes.
func BenchmarkRunPythonPaced(b *testing.B) {
	benchRun(b, py("print(1)"), 50*time.Millisecond)
}

// BenchmarkRunPythonPacedConversation is BenchmarkRunPythonPaced for a
// conversation: what its view of the uploads (mounts, made by the worker on
// the run's path) adds.
func BenchmarkRunPythonPacedConversation(b *testing.B) {
	env := sharedEnv(b)
	area := filepath.Join(env.ws, "uploads", "bench", "temparea")
	if err := os.MkdirAll(area, 0o755); err != nil { // root's: the executor runs as root here
		b.Fatal(err)
	}
	req := py("print(1)")
	req.ConversationID = "bench"
	benchRun(b, req, 50*time.Millisecond)
}

// BenchmarkRunPythonContext runs print(1) in a stateful context: no fork,
// the context process runs it in place.
func BenchmarkRunPythonContext(b *testing.B) {
	req := py("print(1)")
	req.ContextID = "bench"
	benchRun(b, req, 0)
}

// BenchmarkRunBash is the same for echo 1.
func BenchmarkRunBash(b *testing.B) {
	benchRun(b, sh("echo 1"), 0)
}

func benchRun(b *testing.B, req wire.RunRequest, pause time.Duration) {
	env := sharedEnv(b)
	ctx := context.Background()
	env.run(b, req) // warm the connection
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		if pause > 0 {
			b.StopTimer()
			time.Sleep(pause)
			b.StartTimer()
		}
		start := time.Now()
		res, err := env.client.Run(ctx, req, nil)
		times = append(times, time.Since(start))
		if err != nil || res.Status != wire.StatusCompleted || res.Stdout != "1\n" {
			b.Fatalf("%v %+v", err, res)
		}
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds())/1000, "p90-ms")
	b.ReportMetric(float64(times[len(times)*99/100].Microseconds())/1000, "p99-ms")
}

func BenchmarkRunBashPaced(b *testing.B) {
	benchRun(b, sh("echo 1"), 50*time.Millisecond)
}
