package server

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/usage"
)

// Metrics are the server's Prometheus metrics, in a registry of
// their own.
type Metrics struct {
	reg           *prometheus.Registry
	requests      *prometheus.CounterVec
	apiErrors     *prometheus.CounterVec
	executions    *prometheus.CounterVec
	execDuration  prometheus.Histogram
	uploadBytes   prometheus.Counter
	sessionEvents *prometheus.CounterVec
	reapDuration  prometheus.Histogram
	reapActions   prometheus.Counter
}

// NewMetrics registers the metrics. Sessions by status are counted in the
// store and sandboxes by state in the manager, at scrape time.
func NewMetrics(st store.Store, sessions *session.Manager) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_http_requests_total", Help: "HTTP requests by method, route and status code.",
		}, []string{"method", "route", "code"}),
		apiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_api_errors_total", Help: "Error responses by error code.",
		}, []string{"code"}),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_executions_total", Help: "Finished executions by final status.",
		}, []string{"status"}),
		execDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sbx_execution_duration_seconds", Help: "Execution run time in the sandbox.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 1800},
		}),
		uploadBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbx_upload_bytes_total", Help: "Bytes uploaded into workspaces.",
		}),
		sessionEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sbx_lifecycle_events_total",
			Help: "Lifecycle events: sandboxes created, destroyed and lost; sessions paused, resumed, hibernated, restored and expired.",
		}, []string{"event"}),
		reapDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sbx_reaper_pass_seconds", Help: "How long each pass of the reaper took.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 30},
		}),
		reapActions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sbx_reaper_actions_total", Help: "Sessions the reaper paused, hibernated or expired.",
		}),
	}
	m.reg.MustRegister(m.requests, m.apiErrors, m.executions, m.execDuration, m.uploadBytes, m.sessionEvents,
		m.reapDuration, m.reapActions,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if st != nil {
		m.reg.MustRegister(&countCollector{
			desc:  prometheus.NewDesc("sbx_sessions", "Sessions by status.", []string{"status"}, nil),
			count: st.CountSessions,
		})
	}
	if sessions != nil {
		m.reg.MustRegister(&countCollector{
			desc:  prometheus.NewDesc("sbx_sandboxes", "Sandboxes of this server by state (starting, running, paused).", []string{"state"}, nil),
			count: func(context.Context) (map[string]int, error) { return sessions.SandboxCounts(), nil },
		})
		m.reg.MustRegister(&countCollector{
			desc:  prometheus.NewDesc("sbx_pool_ready", "Warm-pool sandboxes ready, by template (hits and misses: sbx_lifecycle_events_total).", []string{"template"}, nil),
			count: func(context.Context) (map[string]int, error) { return sessions.PoolSizes(), nil },
		})
	}
	return m
}

// RegisterUsage exports, per tenant, what the sandboxes this process
// holds use, as of the sampler's last pass: read at scrape time,
// never waiting on a sandbox. With replicas each reports the sandboxes it
// holds; one that two replicas hold (each served a call of its session)
// counts in both.
func (m *Metrics) RegisterUsage(u *usage.Sampler) {
	m.reg.MustRegister(usageCollector{u})
}

var (
	tenantCPUDesc = prometheus.NewDesc("sbx_tenant_sandbox_cpu_seconds_total",
		"CPU time of the tenant's sandboxes held by this process, those destroyed or let go since it started included (a sandbox's last seconds before the first sample of it are not counted when it lives under one sample interval).", []string{"tenant"}, nil)
	tenantMemoryDesc = prometheus.NewDesc("sbx_tenant_sandbox_memory_bytes",
		"Memory of the tenant's sandboxes held by this process, page cache included (what their memory limits count).", []string{"tenant"}, nil)
	tenantDiskDesc = prometheus.NewDesc("sbx_tenant_sandbox_disk_bytes",
		"Bytes in the workspaces of the tenant's sessions whose sandboxes this process holds, as their disk quotas count them (0 without quotas).", []string{"tenant"}, nil)
	tenantPIDsDesc = prometheus.NewDesc("sbx_tenant_sandbox_pids",
		"Processes and threads in the tenant's sandboxes held by this process.", []string{"tenant"}, nil)
	tenantSandboxesDesc = prometheus.NewDesc("sbx_tenant_sandboxes",
		"Sandboxes of the tenant this process holds (running or paused), as of the last sample.", []string{"tenant"}, nil)
)

// usageCollector exports a Sampler's per-tenant sums.
type usageCollector struct{ u *usage.Sampler }

func (usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{tenantCPUDesc, tenantMemoryDesc, tenantDiskDesc, tenantPIDsDesc, tenantSandboxesDesc} {
		ch <- d
	}
}

func (c usageCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.u.Tenants() {
		ch <- prometheus.MustNewConstMetric(tenantCPUDesc, prometheus.CounterValue, t.CPUSeconds, t.Name)
		ch <- prometheus.MustNewConstMetric(tenantMemoryDesc, prometheus.GaugeValue, float64(t.MemoryBytes), t.Name)
		ch <- prometheus.MustNewConstMetric(tenantDiskDesc, prometheus.GaugeValue, float64(t.DiskBytes), t.Name)
		ch <- prometheus.MustNewConstMetric(tenantPIDsDesc, prometheus.GaugeValue, float64(t.PIDs), t.Name)
		ch <- prometheus.MustNewConstMetric(tenantSandboxesDesc, prometheus.GaugeValue, float64(t.Sandboxes), t.Name)
	}
}

// Handler serves the metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ExecutionFinished counts an execution's end.
func (m *Metrics) ExecutionFinished(status string, d time.Duration) {
	m.executions.WithLabelValues(status).Inc()
	m.execDuration.Observe(d.Seconds())
}

// SessionEvent counts a lifecycle event (see session.Options.Events).
func (m *Metrics) SessionEvent(event string) { m.sessionEvents.WithLabelValues(event).Inc() }

// Reaped records a pass of the reaper.
func (m *Metrics) Reaped(took time.Duration, acted int) {
	m.reapDuration.Observe(took.Seconds())
	m.reapActions.Add(float64(acted))
}

// countCollector exports counts by label computed at scrape time.
type countCollector struct {
	desc  *prometheus.Desc
	count func(context.Context) (map[string]int, error)
}

func (c *countCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *countCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.count(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for label, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), label)
	}
}
