package e2b

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/usage"
)

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// sandboxMetrics: GET /sandboxes/{id}/metrics?start=&end= (unix seconds,
// both optional), what the SDKs' getMetrics calls: the samples the
// sampler took of the session's sandbox between start and end, oldest
// first, and then a reading taken now unless end is past. A sandbox
// without a running or paused sandbox (hibernated, or starting) has
// none: [].
func (h *Handler) sandboxMetrics(w http.ResponseWriter, r *http.Request) {
	tenant, err := h.apiTenant(r)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	s, _, ref, err := h.opt.Sessions.SandboxOf(r.Context(), tenant, r.PathValue("id"))
	if err == nil && s.Status == api.StatusTerminated {
		err = fmt.Errorf("sandbox %s was killed or timed out: %w", s.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	start, err := unixParam(r, "start")
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	end, err := unixParam(r, "end")
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if h.opt.Usage == nil {
		h.writeErr(w, r, fmt.Errorf("this server samples no sandbox usage: %w", errdefs.ErrUnavailable))
		return
	}
	cur, samples, err := h.opt.Usage.Now(r.Context(), ref, start)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	in := func(t time.Time) bool { return end.IsZero() || t.Before(end.Add(time.Second)) }
	out := []metricJSON{}
	for _, smp := range samples {
		if in(smp.Time) {
			out = append(out, toMetric(smp))
		}
	}
	if cur != nil && in(cur.Time) {
		out = append(out, toMetric(*cur))
	}
	writeJSON(w, http.StatusOK, out)
}

// unixParam reads a time in unix seconds from the query; zero if absent.
func unixParam(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, invalid("%s %q: want a unix time in seconds", name, v)
	}
	return time.Unix(n, 0), nil
}

// toMetric is a sample as E2B says it: memory used without the page
// cache (as E2B's daemon reports a VM's), the cache apart, and whole
// cores.
func toMetric(s usage.Sample) metricJSON {
	return metricJSON{
		Timestamp: s.Time.UTC(), TimestampUnix: s.Time.Unix(),
		CPUCount: int(math.Ceil(s.CPUCount)), CPUUsedPct: s.CPUPct,
		MemUsed: max(0, s.MemoryBytes-s.MemoryCacheBytes), MemTotal: s.MemoryLimitBytes, MemCache: s.MemoryCacheBytes,
		DiskUsed: s.DiskBytes, DiskTotal: s.DiskLimitBytes,
	}
}
