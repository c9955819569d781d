package server

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/usage"
)

// getSessionMetrics: GET /sessions/{id}/metrics. A session
// without a running or paused sandbox answers what it has instead of
// readings, and so does one whose runtime reads no stats (usage.Live):
// its sandbox state, no current reading and no samples.
func (s *Server) getSessionMetrics(w http.ResponseWriter, r *http.Request) {
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			s.writeError(w, r, fmt.Errorf("since %q: want an RFC 3339 time: %w", v, errdefs.ErrInvalidArgument))
			return
		}
		since = t
	}
	if s.opt.Usage == nil {
		s.writeError(w, r, fmt.Errorf("this server samples no sandbox usage: %w", errdefs.ErrUnavailable))
		return
	}
	sess, state, ref, err := s.opt.Sessions.SandboxOf(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	cur, samples, err := s.opt.Usage.Now(r.Context(), ref, since)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.SessionMetrics{
		SessionID: sess.ID, Sandbox: state, IntervalSeconds: s.opt.Usage.Interval().Seconds(),
		Samples: make([]api.MetricsSample, 0, len(samples)),
	}
	if ref != nil && cur == nil && usage.Live(ref.Runtime) {
		out.Sandbox = api.SandboxNone // gone since the session was read
	}
	if cur != nil {
		c := toAPISample(*cur)
		out.Current = &c
	}
	for _, smp := range samples {
		out.Samples = append(out.Samples, toAPISample(smp))
	}
	writeJSON(w, http.StatusOK, out)
}

func toAPISample(s usage.Sample) api.MetricsSample {
	return api.MetricsSample{
		Timestamp: s.Time.UTC(), CPUUsedPct: s.CPUPct, CPUCount: s.CPUCount,
		MemoryUsedBytes: s.MemoryBytes, MemoryCacheBytes: s.MemoryCacheBytes, MemoryLimitBytes: s.MemoryLimitBytes,
		DiskUsedBytes: s.DiskBytes, DiskLimitBytes: s.DiskLimitBytes, PIDs: s.PIDs, PIDsLimit: s.PIDsLimit,
	}
}
