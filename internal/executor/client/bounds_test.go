package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// fakeExecutor serves handler on a unix socket, as a sandbox that replaced
// its executor would, and counts the bytes it managed to send.
func fakeExecutor(t *testing.T, handler func(w http.ResponseWriter, r *http.Request)) (*Client, *atomic.Int64) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handler(&countingWriter{ResponseWriter: w, n: &sent}, r)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() { c.Close() })
	return c, &sent
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func (c *countingWriter) Flush() { c.ResponseWriter.(http.Flusher).Flush() }

// endless writes chunk until the client hangs up or a bound far beyond any
// the client may read is reached (so that a client without bounds fails
// the test rather than exhausting the machine).
func endless(w http.ResponseWriter, prefix, chunk string, total *atomic.Int64) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	io.WriteString(w, prefix)
	for total.Load() < 1<<30 {
		if _, err := io.WriteString(w, chunk); err != nil {
			return
		}
	}
}

// TestClientBoundsWhatTheExecutorSends: a fake executor that streams an
// endless line, endless output events or a giant value gets a failed call
// with ErrBadResponse, and the client reads no more than its bound (the
// host's memory stays within it) nor passes on more output than the
// request's limit.
func TestClientBoundsWhatTheExecutorSends(t *testing.T) {
	const limit = 64 << 10
	bound := maxEventLine(limit) + 1<<20 // the line bound, plus transport buffers
	big := strings.Repeat("x", 1<<20)
	cases := []struct {
		name    string
		handler func(sent *atomic.Int64) http.HandlerFunc
		want    string
	}{
		{"endless line", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { endless(w, `{"type":"stdout","data":"`, big, sent) }
		}, "an event of more than"},
		{"endless output events", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				endless(w, "", `{"type":"stdout","data":"`+strings.Repeat("y", 4096)+`"}`+"\n", sent)
			}
		}, "more stdout than its limit"},
		{"endless unknown events", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) { endless(w, "", `{"type":"ping"}`+"\n", sent) }
		}, "unknown event type"},
		{"giant return value", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				fmt.Fprintf(w, `{"type":"result","result":{"id":"x","status":"completed","return_value":"%s"}}`+"\n", strings.Repeat("z", wire.MaxReturnValueBytes+10))
			}
		}, "a return value of"},
		{"giant stdout in the result", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				fmt.Fprintf(w, `{"type":"result","result":{"id":"x","status":"completed","stdout":"%s"}}`+"\n", strings.Repeat("s", 2*limit))
			}
		}, "output of"},
		{"too many artifacts", func(sent *atomic.Int64) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				io.WriteString(w, `{"type":"result","result":{"id":"x","status":"completed","artifacts":["a"`+strings.Repeat(`,"a"`, wire.MaxArtifacts)+`]}}`+"\n")
			}
		}, "artifacts, more than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var sent *atomic.Int64
			var h http.HandlerFunc
			c, s := fakeExecutor(t, func(w http.ResponseWriter, r *http.Request) { h(w, r) })
			sent = s
			h = tc.handler(sent)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var passed int64
			res, err := c.Run(ctx, wire.RunRequest{ID: "x", Language: "python", Code: "1", OutputLimitBytes: limit}, func(_, data string) { passed += int64(len(data)) })
			if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run = %v, %v; want ErrBadResponse: %s", res, err, tc.want)
			}
			if passed > limit+maxMarkerBytes {
				t.Errorf("%d bytes of output passed on, the limit is %d", passed, limit)
			}
			c.Close()
			// The fake stops writing once the client has hung up.
			deadline := time.Now().Add(time.Minute)
			for last := int64(-1); sent.Load() != last && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				last = sent.Load()
			}
			t.Logf("%v; the fake sent %d bytes", err, sent.Load())
			if tc.name != "giant return value" && sent.Load() > bound {
				t.Errorf("the fake sent %d bytes before the client gave up; the bound is %d", sent.Load(), bound)
			}
		})
	}

	t.Run("endless health", func(t *testing.T) {
		var sent *atomic.Int64
		c, s := fakeExecutor(t, func(w http.ResponseWriter, _ *http.Request) { endless(w, `{"ok":true,"version":"`, big, sent) })
		sent = s
		if _, err := c.Health(context.Background()); !errors.Is(err, ErrBadResponse) {
			t.Fatalf("Health = %v, want ErrBadResponse", err)
		}
	})
}

// TestClientBoundsStats: the control plane reads every sandbox's stats
// every few seconds; an answer larger than a dozen numbers can be fails
// the call at its bound (64 KiB), well before the 1 MiB of the other
// small answers, and an honest one of any size up to it passes.
func TestClientBoundsStats(t *testing.T) {
	for _, tc := range []struct {
		pad  int
		fail bool
	}{{200 << 10, true}, {maxStatsResponse - 200, false}} {
		c, _ := fakeExecutor(t, func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, `{"memory_usage_bytes":5,"padding":"%s"}`, strings.Repeat("p", tc.pad))
		})
		st, err := c.Stats(context.Background())
		if tc.fail {
			if !errors.Is(err, ErrBadResponse) || !strings.Contains(err.Error(), fmt.Sprint(maxStatsResponse)) {
				t.Errorf("stats of %d bytes: %+v, %v; want ErrBadResponse at %d bytes", tc.pad, st, err, maxStatsResponse)
			}
		} else if err != nil || st.MemoryUsageBytes != 5 {
			t.Errorf("stats of %d bytes: %+v, %v", tc.pad, st, err)
		}
	}
}
