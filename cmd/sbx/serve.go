package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/internal/app"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/e2b"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/telemetry"
	sbxusage "github.com/sbx-sandbox/sbx/internal/usage"
)

const serveUsage = `usage: sbx serve [flags]

Serves the HTTP API (api/openapi.yaml) on the embedded defaults: SQLite in
the data directory, local files, runc. Logs are JSON lines on stderr.

Without API keys the server accepts every request as tenant "default" and
listens on loopback only. With keys (--api-key, or SBX_API_KEYS=KEY[:TENANT],...)
every request needs "Authorization: Bearer KEY" or "X-API-Key: KEY", and
each tenant sees only its own sessions.

flags:
`

// serve implements `sbx serve`.
func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage); fs.PrintDefaults() }
	var (
		addr       = fs.String("addr", "127.0.0.1:7070", "listen `address`")
		data       = fs.String("data-dir", dataDir(), "data `dir`: database, templates, workspaces, blobs (env SBX_DATA_DIR)")
		state      = fs.String("state-dir", stateDir(), "sandbox state `dir` (env SBX_STATE_DIR)")
		storeURL   = fs.String("store", os.Getenv("SBX_STORE"), "metadata store `URL`: sqlite:///PATH (default DATA-DIR/sbx.db) or postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=disable (env SBX_STORE)")
		storeWait  = fs.Duration("store-wait", time.Minute, "how long to wait at start for a PostgreSQL store that does not answer yet")
		blobURL    = fs.String("blob", os.Getenv("SBX_BLOB"), "blob store `URL`: file:///PATH (default DATA-DIR/blobs) or s3://BUCKET/PREFIX?endpoint=http://HOST:PORT&region=REGION (credentials from the AWS environment and shared config; env SBX_BLOB)")
		tmplDir    = fs.String("template-dir", "", "built templates `dir` (default DATA-DIR/templates)")
		level      = fs.String("log-level", "info", "debug, info, warn or error")
		prebuild   = fs.String("prebuild", "python", "comma-separated `templates` to build in the background at start (\"\" for none)")
		tmplBuilds = fs.Int("template-builds", 1, "template builds over the API that run at once; more queue")
		idle       = fs.Duration("idle-timeout", session.DefaultIdleTimeout, "default idle time after which a session's sandbox is paused (frozen)")
		hibern     = fs.Duration("hibernate-timeout", session.DefaultHibernateTimeout, "default idle time after which a session is hibernated (workspace to the blob store, sandbox destroyed)")
		ttl        = fs.Duration("ttl", session.DefaultTTL, "default time to live of a session (at most 168h)")
		maxSbx     = fs.Int("max-sandboxes", 0, "most live sandboxes; past it executions get 503 with Retry-After (0: no limit)")
		limits     = fs.String("limits", "", limitsUsage(app.ThisMachine()))
		overcommit = fs.Float64("disk-overcommit", 1, "how many times the workspace file system's size the sessions' disk quotas (resources.disk) may add up to, over all tenants, and a tenant's by default (0: no bound); past it a create is 429")
		sessMax    = fs.String("session-max", "", "what one session may ask for, as `cpu=C,memory=MiB,disk=MiB` (default: this machine's cores and memory, and the workspace file system's size, which no disk may pass)")
		hdrTime    = fs.Duration("http-header-timeout", server.DefaultReadHeaderTimeout, "time a client has to send a request's headers")
		connIdle   = fs.Duration("http-idle-timeout", server.DefaultHTTPIdleTimeout, "keep-alive connections idle this long are closed")
		bodyTime   = fs.Duration("http-body-timeout", server.DefaultBodyTimeout, "a request body that sends nothing this long loses its connection (also its head start before --http-min-body-rate)")
		bodyRate   = fs.Int64("http-min-body-rate", server.DefaultMinBodyRate, "slowest average `bytes/s` a request body may arrive at (negative: no minimum)")
		snapDepth  = fs.Int("snapshot-max-depth", snapshot.DefaultMaxDepth, "deepest directory nesting a snapshot or hibernation saves")
		snapPath   = fs.Int("snapshot-max-path", snapshot.DefaultMaxPath, "longest path, in bytes, a snapshot or hibernation saves")
		snapN      = fs.Int("snapshot-max-entries", snapshot.DefaultMaxEntries, "most files, directories and links a snapshot or hibernation saves")
		snapBytes  = fs.Int64("snapshot-max-bytes", snapshot.DefaultMaxBytes, "most bytes of file content a snapshot or hibernation reads")
		snapTime   = fs.Duration("snapshot-timeout", snapshot.DefaultTimeout, "longest a snapshot, hibernation or restore may take")
		wsQuota    = fs.String("workspace-quota", "auto", "workspace disk quotas (resources.disk): auto (btrfs: the data dir's own, or an image DATA-DIR/workspaces.img mounted at DATA-DIR/workspaces) or off (no quota: development only)")
		presignMax = fs.Int64("presign-max-bytes", server.DefaultPresignMaxBytes, "largest file a presigned URL is made for (a presign reads, hashes and stores all of it)")
		e2bTTL     = fs.Duration("e2b-token-ttl", e2b.DefaultTokenTTL, "how long an E2B sandbox's access token stays good")
		imageSize  = fs.Int64("workspace-image-size", 0, "size in `GiB` of the workspace image when it is made (sparse; default 64, at most 90% of the free disk)")
		metricsInt = fs.Duration("metrics-interval", sbxusage.DefaultInterval, "how often each sandbox's CPU, memory, disk and processes are sampled (GET /api/v1/sessions/ID/metrics, /metrics)")
		metricsKep = fs.Duration("metrics-history", sbxusage.DefaultKeep, "how far back each session's samples go")
		llmURL     = fs.String("llm-base-url", os.Getenv("SBX_LLM_BASE_URL"), "the chat loop's OpenAI-compatible chat-completions endpoint, as the `URL` chat/completions is under (http://127.0.0.1:8000/v1; env SBX_LLM_BASE_URL); none: POST /agents/{id}/chat is 503")
		llmModel   = fs.String("llm-model", os.Getenv("SBX_LLM_MODEL"), "the chat loop's model, unless a request names one (env SBX_LLM_MODEL; default: the first of --llm-models)")
		llmModels  = fs.String("llm-models", os.Getenv("SBX_LLM_MODELS"), "comma-separated `models` a chat request may name, all paid with --llm-api-key; others are 400 (env SBX_LLM_MODELS; default: --llm-model alone)")
		llmKey     = fs.String("llm-api-key", "", "API key for the chat loop's endpoint (env SBX_LLM_API_KEY, better: every user of the machine sees a command line)")
		llmSteps   = fs.Int("llm-max-steps", chat.DefaultMaxSteps, "most model calls of one chat turn; a model still calling tools at the last one ends the turn (env SBX_LLM_MAX_STEPS)")
		llmTurns   = fs.Int("llm-history-turns", chat.DefaultHistoryTurns, "last turns a chat's history keeps whole; older ones the model summarizes")
		llmTokens  = fs.Int("llm-history-tokens", chat.DefaultHistoryTokens, "budget of a chat's history in tokens (bytes / 4), past which older turns are summarized too")
		evKeep     = fs.Duration("event-retention", app.DefaultEventRetention, "how long lifecycle events are kept (the streams and webhooks read them)")
		metricsTok = fs.String("metrics-token", "", "the `TOKEN` GET /metrics asks for as Authorization: Bearer TOKEN; with API keys it is required (an API key gets 403: the metrics name every tenant) (env SBX_METRICS_TOKEN, better: every user of the machine sees a command line)")
		rtName     = fs.String("runtime", "runc", "where sandboxes run: runc (containers on this host) or kubernetes (Pods of a cluster: in-cluster config, or --kubeconfig)")
		kubeconfig = fs.String("kubeconfig", "", "with --runtime kubernetes: the cluster's kubeconfig `file` (default: the cluster sbx runs in)")
		sandboxNS  = fs.String("sandbox-namespace", "sbx-sandboxes", "with --runtime kubernetes: the `namespace` of sandbox Pods and of the executors' signing key")
		registry   = fs.String("registry", "", "with --runtime kubernetes: the registry `HOST[/PREFIX]` Pods pull template images from (sbx image push); default: images provided on the nodes")
		userNS     = fs.Bool("user-namespaces", false, "with --runtime kubernetes: give every sandbox Pod a user namespace of its own (hostUsers: false); needs nodes with containerd 2 and runc 1.2 or later, where a Pod asking for one fails to start otherwise (docs/kubernetes.md)")
		hookPriv   = fs.Bool("webhook-allow-private", false, "let webhooks reach loopback, private, link-local and reserved addresses (refused by default: a tenant could make the server call its own ports, its database or a cloud metadata service)")
		keySpecs   multiFlag
		poolSpecs  multiFlag
		tenantLim  multiFlag
		classSpecs multiFlag
	)
	fs.Var(&classSpecs, "runtime-class", "with --runtime kubernetes: the RuntimeClass sandbox Pods run under, per template runtime, as `RUNTIME=CLASS,...` (runsc=gvisor; repeatable); a bare CLASS is runc's, every template's that names no other runtime; a template of runsc or crun with no class does not start")
	fs.Var(&tenantLim, "tenant-limit", "one tenant's limits as `TENANT:NAME=VALUE,...`, over --limits (repeatable)")
	fs.Var(&poolSpecs, "pool", "warm pool as `TEMPLATE=SIZE`: sandboxes kept started for new sessions (repeatable); with --runtime kubernetes the size is the deployment's, shared by every replica and filled by the leader")
	fs.Var(&keySpecs, "api-key", "API key as `KEY[:TENANT]` (repeatable; tenant default \"default\")")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sbx serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(stderr, "sbx serve: --log-level %q: %v\n", *level, err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	specs := append([]string(nil), keySpecs...)
	if env := os.Getenv("SBX_API_KEYS"); env != "" {
		specs = append(specs, strings.Split(env, ",")...)
	}
	keys, err := server.ParseKeys(specs)
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 2
	}
	if err := app.CheckAddr(*addr, keys); err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 2
	}
	if *metricsTok == "" {
		*metricsTok = os.Getenv("SBX_METRICS_TOKEN")
	}
	if err := server.CheckMetricsToken(*metricsTok, keys); err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 2
	}
	if len(keys) > 0 && *metricsTok == "" {
		log.Warn("API keys but no --metrics-token (SBX_METRICS_TOKEN): GET /metrics answers no one")
	}
	if len(keys) == 0 {
		log.Warn("no API keys configured: listening on loopback only; every request is tenant \"default\"")
	}
	pools := map[string]int{}
	for _, p := range poolSpecs {
		name, size, ok := strings.Cut(p, "=")
		n, err := strconv.Atoi(size)
		if !ok || err != nil || n < 0 || n > 1000 || name == "" {
			fmt.Fprintf(stderr, "sbx serve: --pool %q: want TEMPLATE=SIZE, SIZE 0..1000\n", p)
			return 2
		}
		pools[name] = n
	}
	if env := os.Getenv("SBX_LIMITS"); env != "" && !flagSet(fs, "limits") {
		*limits = env
	}
	// Checked here, applied by app.Open over the defaults it makes from
	// the machine once the workspace file system is open.
	lim, err := server.ParseLimits(*limits, app.DefaultLimits(app.ThisMachine(), *overcommit))
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve: --limits:", err)
		return 2
	}
	if _, err := server.ParseTenantLimits(tenantLim, session.Limits{}); err != nil {
		fmt.Fprintln(stderr, "sbx serve: --tenant-limit:", err)
		return 2
	}
	if *overcommit < 0 || math.IsNaN(*overcommit) || math.IsInf(*overcommit, 0) {
		fmt.Fprintf(stderr, "sbx serve: --disk-overcommit %v: want 0 (no bound) or more\n", *overcommit)
		return 2
	}
	limitsFor := func(m app.Machine) (session.Limits, map[string]session.Limits, error) {
		lim, err := server.ParseLimits(*limits, app.DefaultLimits(m, *overcommit))
		if err != nil {
			return lim, nil, fmt.Errorf("--limits: %w", err)
		}
		tl, err := server.ParseTenantLimits(tenantLim, lim)
		if err != nil {
			return lim, nil, fmt.Errorf("--tenant-limit: %w", err)
		}
		return lim, tl, nil
	}
	maxRes, err := server.ParseSessionMax(*sessMax)
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve: --session-max:", err)
		return 2
	}
	if m := app.ThisMachine(); maxRes.CPU == 0 || maxRes.Memory == 0 {
		if maxRes.CPU == 0 {
			maxRes.CPU = float64(m.CPUs)
		}
		if maxRes.Memory == 0 {
			maxRes.Memory = m.MemoryMB
		}
	}
	llm, err := llmConfig(fs, *llmURL, *llmModel, *llmModels, *llmKey, *llmSteps, *llmTurns, *llmTokens)
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 2
	}
	if llm.BaseURL != "" && len(keys) > 0 && lim.ChatTokens == 0 {
		log.Warn("the chat loop has no token budget: every tenant may spend as many of the model's tokens as it likes on --llm-api-key; set --limits chat_tokens=N")
	}
	if llm.BaseURL != "" {
		u, _ := url.Parse(llm.BaseURL)
		log.Info("chat loop", "llm_base_url", u.Redacted(), "llm_model", llm.Model, "llm_models", llm.Models, "llm_api_key", llm.APIKey != "", "llm_max_steps", llm.MaxSteps)
	}
	// Traces (issue 15) are on when OTEL_EXPORTER_OTLP_ENDPOINT says
	// where to send them; flushed after the app has closed, whose
	// shutdown ends the executions' spans.
	stopTraces, err := telemetry.Setup(ctx, "sbx", version, log)
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 2
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTraces(ctx); err != nil {
			log.Warn("traces: the last spans were not sent", "err", err)
		}
	}()
	var templates []string
	for _, t := range strings.Split(*prebuild, ",") {
		if t = strings.TrimSpace(t); t != "" {
			templates = append(templates, t)
		}
	}
	var kubernetes *app.Kubernetes
	switch *rtName {
	case "runc":
	case "kubernetes":
		if kubernetes, err = kubernetesConfig(*kubeconfig, *sandboxNS, *registry, classSpecs, *userNS); err != nil {
			fmt.Fprintf(stderr, "sbx serve: %v\n", err)
			return 2
		}
	default:
		fmt.Fprintf(stderr, "sbx serve: --runtime %q: want runc or kubernetes\n", *rtName)
		return 2
	}
	a, err := app.Open(ctx, app.Config{
		Kubernetes: kubernetes,
		Addr:       *addr, Version: version, DataDir: *data, StateDir: *state, TemplateDir: *tmplDir, TemplateBuilds: *tmplBuilds, Keys: keys, MetricsToken: *metricsTok, Prebuild: templates, Log: log,
		Store: *storeURL, StoreWait: *storeWait, Blob: *blobURL, PresignMaxBytes: *presignMax, E2BTokenTTL: *e2bTTL,
		Defaults:     session.Defaults{TTL: *ttl, IdleTimeout: *idle, HibernateTimeout: *hibern},
		MaxSandboxes: *maxSbx, Pools: pools, WorkspaceQuota: *wsQuota, WorkspaceImageSize: *imageSize << 30,
		LimitsFor: limitsFor, DiskOvercommit: *overcommit, MaxResources: maxRes, Chat: llm,
		MetricsInterval: *metricsInt, MetricsHistory: *metricsKep,
		Edge:      server.EdgeLimits{ReadHeaderTimeout: *hdrTime, IdleTimeout: *connIdle, BodyTimeout: *bodyTime, MinBodyRate: *bodyRate},
		Snapshots: snapshot.Limits{MaxDepth: *snapDepth, MaxPath: *snapPath, MaxEntries: *snapN, MaxBytes: *snapBytes, Timeout: *snapTime},
		Events:    app.EventsConfig{Retention: *evKeep, WebhookAllowPrivate: *hookPriv},
	})
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 1
	}
	defer a.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 1
	}
	log.Info("serving", "url", "http://"+ln.Addr().String(), "data_dir", *data, "tenants", len(keys))
	if err := a.Serve(ctx, ln); err != nil {
		fmt.Fprintln(stderr, "sbx serve:", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// limitsUsage is --limits's help: the names, and the defaults this
// machine gives them (app.DefaultLimits), except disk's, which waits for
// the workspace file system.
func limitsUsage(m app.Machine) string {
	d := app.DefaultLimits(m, 1)
	return fmt.Sprintf("every tenant's limits as `NAME=VALUE,...`, over defaults made from this machine (0 is no bound; env SBX_LIMITS): "+
		"sandboxes (live ones; default one per 256 MiB of memory, here %d), memory (MiB, summed over its live sandboxes; default 3/4 of the memory, here %d), "+
		"cpu (cores, summed likewise; default 4 per core, here %v), disk (MiB, the sum of its sessions' resources.disk; default the workspace file system's size times --disk-overcommit), "+
		"sessions (not terminated; default %d), history (executions kept per session; default %d), history_size (MiB the tenant's executions take in the metadata store; default %d), "+
		"snapshots (kept per session; default %d), stored (MiB in the blob store: snapshots, hibernated workspaces, resource content, presigned copies; default %d), "+
		"streams (requests held open, of each kind; default %d), chats (chat turns at once; default %d), chat_tokens (model tokens an hour, K or M; default none: what is dear depends on the model)",
		d.Sandboxes, d.MemoryMB, d.CPU, d.Sessions, d.History, d.HistoryMB, d.Snapshots, d.StoredMB, d.Streams, d.Chats)
}

// llmConfig is the chat loop's endpoint from the --llm-* flags
// and their SBX_LLM_* variables. The key is never logged nor shown as a
// flag's default.
func llmConfig(fs *flag.FlagSet, baseURL, model, models, key string, steps, turns, tokens int) (chat.Config, error) {
	if key == "" {
		key = os.Getenv("SBX_LLM_API_KEY")
	}
	if env := os.Getenv("SBX_LLM_MAX_STEPS"); env != "" && !flagSet(fs, "llm-max-steps") {
		n, err := strconv.Atoi(env)
		if err != nil {
			return chat.Config{}, fmt.Errorf("SBX_LLM_MAX_STEPS=%q: want a number", env)
		}
		steps = n
	}
	if baseURL == "" {
		return chat.Config{}, nil
	}
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return chat.Config{}, fmt.Errorf("--llm-base-url %q: want http(s)://HOST[:PORT]/PATH, the URL chat/completions is under", baseURL)
	}
	var offered []string
	for _, m := range strings.Split(models, ",") {
		if m = strings.TrimSpace(m); m != "" && !slices.Contains(offered, m) {
			offered = append(offered, m)
		}
	}
	if model == "" && len(offered) > 0 {
		model = offered[0]
	}
	switch {
	case model == "":
		return chat.Config{}, fmt.Errorf("--llm-base-url needs --llm-model (or SBX_LLM_MODEL): the model a chat uses unless its request names one")
	case len(offered) > 0 && !slices.Contains(offered, model):
		return chat.Config{}, fmt.Errorf("--llm-model %q is not one of --llm-models (%s): a request that names no model gets it", model, strings.Join(offered, ", "))
	case steps < 1 || steps > 100:
		return chat.Config{}, fmt.Errorf("--llm-max-steps %d: want 1..100", steps)
	case turns < 1 || tokens < 1000:
		return chat.Config{}, fmt.Errorf("--llm-history-turns must be at least 1 and --llm-history-tokens at least 1000")
	}
	return chat.Config{BaseURL: baseURL, Model: model, Models: offered, APIKey: key, MaxSteps: steps, HistoryTurns: turns, HistoryTokens: tokens}, nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// kubernetesConfig is what the flags say of the cluster, with --runtime
// kubernetes.
func kubernetesConfig(kubeconfig, namespace, registry string, classSpecs []string, userNamespaces bool) (*app.Kubernetes, error) {
	classes, err := app.ParseRuntimeClasses(classSpecs)
	if err != nil {
		return nil, err
	}
	return &app.Kubernetes{Kubeconfig: kubeconfig, Namespace: namespace, Registry: registry,
		RuntimeClasses: classes, UserNamespaces: userNamespaces}, nil
}
