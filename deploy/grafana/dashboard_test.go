// Package grafana holds sbx.json, a Grafana dashboard of the metrics sbx
// serve exports at /metrics. Its test holds the dashboard to the server:
// every series an expression names is one the server registers, and every
// sbx_ metric the server registers is on the dashboard.
package grafana

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/usage"
)

func TestDashboardMetricsExist(t *testing.T) {
	exported := exportedSeries(t)
	dash := readDashboard(t)
	used := map[string]bool{}
	for _, q := range dash.queries() {
		for _, name := range metricNames(q) {
			used[name] = true
			if exported[name] == "" {
				t.Errorf("the dashboard queries %s, which the server does not export: %s", name, q)
			}
		}
	}
	// Every metric of sbx's own is on the dashboard (Go's and the
	// process's: those it picks).
	for name, family := range exported {
		if strings.HasPrefix(family, "sbx_") && name == family && !usedFamily(used, exported, family) {
			t.Errorf("the server exports %s, which the dashboard does not show", family)
		}
	}
}

func TestDashboardImportable(t *testing.T) {
	dash := readDashboard(t)
	if len(dash.Inputs) != 1 || dash.Inputs[0].Name != "DS_PROMETHEUS" || dash.Inputs[0].Type != "datasource" || dash.Inputs[0].PluginID != "prometheus" {
		t.Errorf("__inputs = %+v, want the one Prometheus datasource input DS_PROMETHEUS", dash.Inputs)
	}
	ids := map[int]bool{}
	for _, p := range dash.allPanels() {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${DS_PROMETHEUS}" {
			t.Errorf("panel %q: datasource %+v, want the input ${DS_PROMETHEUS}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource.UID != "${DS_PROMETHEUS}" {
				t.Errorf("panel %q: a query's datasource is %+v", p.Title, tg.Datasource)
			}
		}
	}
	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		vars[v.Name] = v.queryText()
	}
	if want := "label_values(sbx_tenant_sandboxes, tenant)"; vars["tenant"] != want {
		t.Errorf("the tenant variable's query is %q, want %q", vars["tenant"], want)
	}
}

// exportedSeries starts the server's metrics as sbx serve does (a store
// and a session manager, so that the scrape-time counts are registered),
// makes every labelled metric have a series, scrapes /metrics and returns
// the series names a query may use, each mapped to its metric family.
func exportedSeries(t *testing.T) map[string]string {
	t.Helper()
	mgr := session.New(session.Options{Pools: map[string]int{"python": 1}}) // never started
	t.Cleanup(mgr.Close)
	// A server with API keys, scraped as Prometheus does it there: with
	// the metrics token (README: Metrics).
	keys, err := server.ParseKeys([]string{"tenant-key-123:t"})
	if err != nil {
		t.Fatal(err)
	}
	const token = "metrics-token-0123"
	srv := server.New(server.Options{Store: countingStore{}, Sessions: mgr, Keys: keys, MetricsToken: token, Log: slog.New(slog.DiscardHandler)})
	h := srv.Handler()
	get := func(path string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	// A request that fails counts in both HTTP metrics.
	if rec := get("/no-such-endpoint"); rec.Code != http.StatusNotFound {
		t.Fatalf("GET /no-such-endpoint: %d, want 404", rec.Code)
	}
	m := srv.Metrics()
	// One sandbox held and sampled, so that the per-tenant series have a
	// value to show.
	rt := runtimetest.NewFake()
	rt.Add("sbx-1")
	rt.SetStats("sbx-1", runtime.Stats{CPUNanos: 1e9, MemoryBytes: 1 << 20, PIDs: 2, Limits: runtime.Resources{CPU: 1, MemoryMB: 512, PIDs: 256}})
	sampler := usage.New(usage.Config{Held: func() []session.SandboxRef {
		return []session.SandboxRef{{Tenant: "t", Session: "s", ID: "sbx-1", Runtime: rt, Volume: "t/nonexistent"}}
	}})
	t.Cleanup(sampler.Close)
	sampler.Pass(context.Background())
	m.RegisterUsage(sampler)
	m.ExecutionFinished("completed", time.Millisecond)
	m.SessionEvent("create")
	m.Reaped(time.Millisecond, 1)

	rec := get("/metrics")
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d", rec.Code)
	}
	series := map[string]string{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		// # TYPE NAME counter|gauge|histogram|summary|untyped
		f := strings.Fields(sc.Text())
		if len(f) != 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		name := f[2]
		series[name] = name
		switch f[3] {
		case "histogram":
			series[name+"_bucket"] = name
			series[name+"_sum"] = name
			series[name+"_count"] = name
		case "summary":
			series[name+"_sum"] = name
			series[name+"_count"] = name
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sbx_sessions", "sbx_sandboxes", "sbx_pool_ready", "sbx_http_requests_total", "go_goroutines", "process_cpu_seconds_total"} {
		if series[want] == "" {
			t.Fatalf("the scrape has no %s; the test no longer sets the server up as sbx serve does", want)
		}
	}
	return series
}

func usedFamily(used map[string]bool, exported map[string]string, family string) bool {
	for name := range used {
		if exported[name] == family {
			return true
		}
	}
	return false
}

// countingStore is the one store method the metrics call: sessions by
// status, counted at scrape time.
type countingStore struct{ store.Store }

func (countingStore) CountSessions(context.Context) (map[string]int, error) {
	return map[string]int{"running": 1}, nil
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource datasource `json:"datasource"`
	Targets    []struct {
		Expr       string     `json:"expr"`
		Datasource datasource `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// queryText is a query variable's PromQL: Grafana writes it as a string
// or as {"query": "..."}.
func (v variable) queryText() string {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	json.Unmarshal(v.Query, &o)
	return o.Query
}

func readDashboard(t *testing.T) *dashboard {
	t.Helper()
	b, err := os.ReadFile("sbx.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("sbx.json: %v", err)
	}
	return &d
}

func (d *dashboard) allPanels() []panel {
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// queries are every PromQL expression of the dashboard: panels' and
// query variables'.
func (d *dashboard) queries() []string {
	var qs []string
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			qs = append(qs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			qs = append(qs, v.queryText())
		}
	}
	return qs
}

var (
	// What is not a metric name: Grafana variables, strings, label
	// matchers, ranges, grouping label lists and numbers.
	promVariable = regexp.MustCompile(`\$(\{[^}]*\}|\w+)`)
	// label_values(METRIC, LABEL) names a label after the metric;
	// label_values(LABEL) only a label.
	promLabelValues = regexp.MustCompile(`label_values\(\s*(?:([^,()]*?)\s*,\s*)?\w+\s*\)`)
	promString      = regexp.MustCompile(`"(\\.|[^"\\])*"|'(\\.|[^'\\])*'`)
	promMatchers    = regexp.MustCompile(`\{[^}]*\}`)
	promRange       = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping    = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promNumber      = regexp.MustCompile(`\b[0-9][0-9.]*([eE][-+]?[0-9]+)?\b`)
	promName        = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promKeywords    = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true, "nan": true}
)

// metricNames returns the metric names an expression selects: the names
// that are neither functions nor aggregations (followed by "("), nor
// keywords, label names or values.
func metricNames(expr string) []string {
	s := promLabelValues.ReplaceAllString(expr, " $1 ")
	s = promVariable.ReplaceAllString(s, " ")
	s = promString.ReplaceAllString(s, " ")
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promGrouping.ReplaceAllString(s, " ")
	s = promNumber.ReplaceAllString(s, " ")
	seen := map[string]bool{}
	for _, loc := range promName.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		if promKeywords[strings.ToLower(name)] || strings.HasPrefix(strings.TrimLeft(s[loc[1]:], " \t\n"), "(") {
			continue
		}
		seen[name] = true
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want string
	}{
		{`sum by (route) (rate(sbx_http_requests_total{instance=~"$instance", code=~"5.."}[$__rate_interval]))`, "sbx_http_requests_total"},
		{`histogram_quantile(0.95, sum by (le) (rate(sbx_execution_duration_seconds_bucket[5m])))`, "sbx_execution_duration_seconds_bucket"},
		{`label_values(sbx_tenant_sandboxes, tenant)`, "sbx_tenant_sandboxes"},
		{`label_values(sbx_http_requests_total{job="sbx"}, instance)`, "sbx_http_requests_total"},
		{`label_values(instance)`, ""},
		{`process_open_fds / process_max_fds`, "process_max_fds process_open_fds"},
		{`max without (instance) (sbx_sessions) or on (status) vector(0)`, "sbx_sessions"},
		{`rate(sbx_upload_bytes_total[1e3s]) * 8`, "sbx_upload_bytes_total"},
	} {
		t.Run(tc.expr, func(t *testing.T) {
			if got := strings.Join(metricNames(tc.expr), " "); got != tc.want {
				t.Errorf("metricNames = %q, want %q", got, tc.want)
			}
		})
	}
}
