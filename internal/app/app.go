// Package app is sbx's composition root: it picks the backends (metadata
// store, blob store, sandbox runtime, workspace quotas) from the
// configuration, wires the control plane's services to them, and runs the
// background work (reaper, collectors). Nothing else constructs them.
package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/internal/chat"
	"github.com/sbx-sandbox/sbx/internal/events"
	"github.com/sbx-sandbox/sbx/internal/execution"
	"github.com/sbx-sandbox/sbx/internal/files"
	"github.com/sbx-sandbox/sbx/internal/quota"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/kube"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/server"
	"github.com/sbx-sandbox/sbx/internal/session"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
	"github.com/sbx-sandbox/sbx/internal/template"
	"github.com/sbx-sandbox/sbx/internal/template/registry"
	"github.com/sbx-sandbox/sbx/internal/usage"
	"github.com/sbx-sandbox/sbx/internal/webhook"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Config is the configuration of `sbx serve`. Zero fields take the
// defaults given.
type Config struct {
	// Addr is where to listen. Default 127.0.0.1:7070. Without API keys
	// only a loopback address is allowed.
	Addr string
	// Version is the server's version, as the MCP server tells clients.
	Version string
	// DataDir holds the database (sbx.db), templates, workspaces, blobs and
	// the URL signing key. Default /var/lib/sbx. Open makes it 0700
	// (dirs.go): only the server enters it.
	DataDir string
	// Store is the URL of the metadata store: sqlite:///PATH (default
	// DataDir/sbx.db) or postgres://USER:PASSWORD@HOST:PORT/DB?sslmode=...
	// (backends.go).
	Store string
	// StoreWait is how long Open waits for a PostgreSQL store that does
	// not answer (a database starting beside the server); 0: not at all.
	StoreWait time.Duration
	// Blob is the URL of the blob store: file:///PATH (default
	// DataDir/blobs).
	Blob string
	// StateDir holds sandbox bundles and runtime state. Default /run/sbx.
	// With the default runtime every sandbox's host user must be able to
	// pass through each directory above it; Open checks that (as root)
	// and fails saying which directory and what to run (dirs.go).
	StateDir string
	// Keys are the API keys and their tenants (see server.ParseKeys). None: no
	// authentication, loopback only, everything belongs to tenant
	// "default".
	Keys server.Keys
	// MetricsToken is what GET /metrics asks for (server.Options). None:
	// with Keys, no one reads it; without, it is open (loopback only).
	MetricsToken string
	// Prebuild names templates to build in the background at start, so
	// that the first session of each does not wait for it.
	Prebuild []string
	// ExecutorPath is the sbx-executor binary; default: beside sbx, then
	// PATH.
	ExecutorPath string
	// TemplateDir holds built templates. Default DataDir/templates.
	TemplateDir string
	// TemplateBuilds is how many template builds over the API run at
	// once; more queue. Default 1.
	TemplateBuilds int
	// Runtime makes the sandbox runtime of a name ("" = runc). Default: the
	// OCI driver, resolving images through the template store
	// (TemplateDir) and volumes under DATA/workspaces (workspace.Volumes);
	// one made here must resolve them the same way. Tests swap in a fake
	// or a failing one.
	Runtime func(name string) (runtime.Runtime, error)
	// Kubernetes, when set, runs sandboxes as Pods of a cluster
	// (internal/runtime/kube) instead of containers on this host; Runtime
	// is then ignored. Their workspaces live in the Pods and are
	// checkpointed to the blob store, which every replica must share.
	Kubernetes *Kubernetes
	// Defaults are the lifecycle periods of sessions that set none
	// (idle pause, hibernation, TTL); zero fields take the built-in ones.
	Defaults session.Defaults
	// MaxSandboxes bounds the live sandboxes (0: no bound); past it an
	// execution is 503 with Retry-After.
	MaxSandboxes int
	// ReapInterval is how often the reaper runs (default 5s).
	ReapInterval time.Duration
	// MetricsInterval is how often the sandboxes' usage is sampled
	// (R-86; default 5s), and MetricsHistory how far back each session's
	// samples go (default 15m).
	MetricsInterval, MetricsHistory time.Duration
	// Pools sizes the warm pool of each template named.
	Pools map[string]int
	// Limits are every tenant's limits (R-79; zero fields: no bound), and
	// TenantLimits a tenant's own, in place of them (server.ParseLimits).
	Limits       session.Limits
	TenantLimits map[string]session.Limits
	// LimitsFor, if set, makes Limits and TenantLimits once Open knows the
	// machine, workspace file system included (limits.go): sbx serve's
	// machine-made defaults (DefaultLimits) with its flags over them.
	LimitsFor func(Machine) (session.Limits, map[string]session.Limits, error)
	// MaxResources caps what one session may ask for; zero fields are the
	// built-in maxima (16 cores, 64 GiB) and, for disk, the workspace
	// file system's size, which a larger disk is lowered to: no session
	// is promised more than the file system holds.
	MaxResources api.Resources
	// DiskOvercommit bounds the sum of every tenant's sessions' disk
	// quotas (resources.disk) at this many times the workspace file
	// system's size: past it a create is 429. 0 is no bound.
	DiskOvercommit float64
	// E2BTokenTTL is how long an E2B sandbox's access token, handed out by
	// a create or a connect, stays good. Default 24h (e2b.DefaultTokenTTL).
	E2BTokenTTL time.Duration
	// PresignMaxBytes is the largest file a presigned URL is made for
	// (default server.DefaultPresignMaxBytes, 8 GiB).
	PresignMaxBytes int64
	// Edge bounds how slowly a client may send headers and bodies and how
	// long an idle connection stays open (server.EdgeLimits has the defaults).
	Edge server.EdgeLimits
	// Snapshots bounds what one snapshot or hibernation may walk, read
	// and take (depth 256, paths of 4096 bytes, 1,000,000 entries, 64 GiB,
	// 30 minutes unless set); its manifests are spooled in DataDir/tmp
	// unless TempDir says otherwise.
	Snapshots snapshot.Limits
	// WorkspaceQuota is how each workspace is held to its session's
	// resources.disk: "auto" (the default) uses btrfs quotas, on the
	// file system of DataDir/workspaces if that is btrfs, else in a btrfs
	// image (DataDir/workspaces.img) mounted there; Open fails, saying
	// why, when neither can be had. "off" gives no quota at all, with a
	// warning at start: for development machines only, since code in a
	// sandbox can then fill the host's disk.
	WorkspaceQuota string
	// WorkspaceImageSize is the size of the workspace image when one is
	// made: the most all workspaces together can hold. It is sparse: the
	// host's disk is used as workspaces fill it. Default 64 GiB, at most
	// 90% of the space free on the data directory's disk.
	WorkspaceImageSize int64
	// Chat is the chat loop's model endpoint: none without a
	// BaseURL, and POST /agents/{id}/chat is then 503.
	Chat chat.Config
	// Events configures lifecycle events and webhooks (events.go).
	Events EventsConfig
	Log    *slog.Logger
}

// machineLimits applies to cfg what the machine has, once the workspace
// file system at root is open: a session's disk within its size, and the
// limits LimitsFor makes. It returns what the sum of the sessions' disks
// is held to: DiskOvercommit times the file system's size.
func machineLimits(cfg *Config, root string, log *slog.Logger) (diskCapacityMB int64, err error) {
	m := ThisMachine()
	ws, err := fileSystemMB(root)
	if err != nil {
		return 0, fmt.Errorf("workspaces: %w", err)
	}
	m.WorkspaceMB = ws
	if d := cfg.MaxResources.Disk; d == 0 || d > ws {
		if d > ws {
			log.Warn("a session's disk is capped at the workspace file system's size", "session_max_disk_mb", d, "workspace_fs_mb", ws)
		}
		cfg.MaxResources.Disk = ws
	}
	if cfg.DiskOvercommit < 0 || math.IsNaN(cfg.DiskOvercommit) {
		return 0, fmt.Errorf("disk overcommit %v: want 0 (no bound) or more", cfg.DiskOvercommit)
	}
	diskCapacityMB = int64(min(float64(ws)*cfg.DiskOvercommit, 1<<53))
	if cfg.LimitsFor != nil {
		if cfg.Limits, cfg.TenantLimits, err = cfg.LimitsFor(m); err != nil {
			return 0, err
		}
	}
	log.Info("limits", "cpus", m.CPUs, "memory_mb", m.MemoryMB, "workspace_fs_mb", ws, "disk_capacity_mb", diskCapacityMB,
		"session_max", cfg.MaxResources, "tenant", cfg.Limits, "tenants_with_own", len(cfg.TenantLimits))
	return diskCapacityMB, nil
}

// defaultImageSize is WorkspaceImageSize's default.
const defaultImageSize = 64 << 30

// openQuota sets up the workspace quotas of cfg.
func openQuota(ctx context.Context, cfg Config, log *slog.Logger) (quota.Dirs, error) {
	root := filepath.Join(cfg.DataDir, "workspaces")
	size := cfg.WorkspaceImageSize
	if size <= 0 {
		size = defaultImageSize
		var st unix.Statfs_t
		if err := unix.Statfs(cfg.DataDir, &st); err == nil {
			size = min(size, int64(st.Bavail)*st.Bsize/10*9)
		}
	}
	q, err := quota.Open(ctx, cfg.WorkspaceQuota, root, filepath.Join(cfg.DataDir, "workspaces.img"), size)
	if err != nil {
		return nil, fmt.Errorf("workspace disk quotas: %w (serve with --workspace-quota=off to run without them, on a machine where no untrusted code runs)", err)
	}
	// Only the server enters the workspaces' root (a mounted image's root
	// comes as mkfs.btrfs made it, 0755); sandboxes reach theirs through
	// bind mounts (dirs.go).
	if err := os.Chmod(root, 0o700); err != nil {
		return nil, fmt.Errorf("workspaces %s: %w", root, err)
	}
	if q.Kind() == "none" {
		log.Warn("workspace disk quotas are OFF: code in a sandbox can fill the host's disk; resources.disk only caps single files")
	} else {
		log.Info("workspace disk quotas", "kind", q.Kind(), "dir", root)
	}
	return q, nil
}

// App is a running control plane: everything `sbx serve` wires together.
type App struct {
	Server    *server.Server
	Store     store.Store
	Sessions  *session.Manager
	Execs     *execution.Service
	Templates *registry.Registry
	Usage     *usage.Sampler
	log       *slog.Logger
	leader    *leadership
	replica   string // this process's name among the replicas
	events    *events.Log
	webhooks  *webhook.Service
	retention time.Duration // of events
	trimmed   time.Time     // when the leader last deleted old events
	stop      chan struct{}
	closeOnce sync.Once
	pods      *kube.Runtime // the sandboxes' runtime on Kubernetes, or nil
	wg        sync.WaitGroup
}

// Open wires the control plane from cfg: it opens the store, fails the
// executions a previous process left unfinished, reconciles sessions with
// the sandboxes that exist, and starts the reaper.
func Open(ctx context.Context, cfg Config) (*App, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:7070"
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "/var/lib/sbx"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "/run/sbx"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	log := cfg.Log
	if err := server.CheckMetricsToken(cfg.MetricsToken, cfg.Keys); err != nil {
		return nil, err
	}
	if err := prepareDataDir(cfg.DataDir, log); err != nil {
		return nil, err
	}
	// The state directory is the default runtime's; a runtime given in
	// cfg keeps its own.
	if cfg.Kubernetes != nil {
		// Nothing of a sandbox is on this host: no workspace directories
		// to hold to a quota.
		cfg.WorkspaceQuota = "off"
	} else if cfg.Runtime == nil {
		if err := checkStateDir(cfg.StateDir, cfg.DataDir); err != nil {
			return nil, err
		}
	}
	key, err := signingKey(filepath.Join(cfg.DataDir, "signing.key"))
	if err != nil {
		return nil, err
	}
	instance, err := instanceID(filepath.Join(cfg.DataDir, "instance.id"))
	if err != nil {
		return nil, err
	}
	st, err := openStore(ctx, cfg.Store, cfg.DataDir, cfg.StoreWait)
	if err != nil {
		return nil, err
	}
	if _, alone := st.(*sqlite.Store); !alone {
		// Replicas of a shared store need not share a data directory:
		// the deployment's instance and signing key are the store's.
		if key, err = shared(ctx, st, "signing-key", key); err == nil {
			var b []byte
			b, err = shared(ctx, st, "instance-id", []byte(instance))
			instance = string(b)
		}
		if err != nil {
			st.Close()
			return nil, err
		}
	}
	blobs, err := openBlobs(ctx, cfg.Blob, cfg.DataDir)
	if err != nil {
		st.Close()
		return nil, err
	}
	if cfg.TemplateDir == "" {
		cfg.TemplateDir = filepath.Join(cfg.DataDir, "templates")
	}
	templates := template.NewStore(cfg.TemplateDir)
	if cfg.Kubernetes == nil {
		// A server whose sandboxes are Pods has no OCI runtime to build
		// in: its templates are built elsewhere and their images provided
		// (sbx image push; docs/kubernetes.md), and a build is refused.
		templates.Jobs = oci.NewJobRunner(oci.Config{StateDir: cfg.StateDir, Log: log})
	}
	// A sandbox's image is a template build of the store, its volume a
	// workspace under DATA/workspaces: what the runtime resolves them to.
	volumes := workspace.Volumes(filepath.Join(cfg.DataDir, "workspaces"))
	newRuntime := cfg.Runtime
	var pods *kube.Runtime
	if cfg.Kubernetes != nil {
		if pods, err = openKubernetes(ctx, *cfg.Kubernetes, cfg.ExecutorPath, log); err != nil {
			st.Close()
			return nil, err
		}
		// One runtime runs every template's Pods, under the RuntimeClass
		// mapped for the template's runtime (runtime.Spec.Runtime); a
		// template of a runtime with none is refused here, before anything
		// is made for it.
		newRuntime = func(name string) (runtime.Runtime, error) {
			if _, err := pods.RuntimeClass(name); err != nil {
				return nil, err
			}
			return pods, nil
		}
	} else if newRuntime == nil {
		newRuntime = func(name string) (runtime.Runtime, error) {
			return oci.New(oci.Config{Runtime: name, StateDir: cfg.StateDir, ExecutorPath: cfg.ExecutorPath, Log: log,
				Images: templates, Volumes: volumes})
		}
	}
	// The default runtime is made up front to learn the sandbox owners and
	// to say early if it is missing; the server still serves session and
	// file calls without it.
	var owners workspace.Owners
	rootUID, userUID := oci.DefaultOwners()
	if pods != nil {
		// A Pod's files carry the sandbox's own ids: no host maps them.
		rootUID, userUID = 0, kube.SandboxUID
	}
	owners.Root, owners.User = workspace.Owner{UID: rootUID, GID: rootUID}, workspace.Owner{UID: userUID, GID: userUID}
	if rt, err := newRuntime(""); err != nil {
		log.Error("the default sandbox runtime is not usable; executions will fail until it is", "err", err)
	} else {
		// What the control plane will and will not ask of it.
		log.Info("sandbox runtime", "capabilities", runtime.CapabilitiesOf(rt))
	}
	if err := cfg.Defaults.Check(); err != nil {
		st.Close()
		return nil, err
	}
	if cfg.Snapshots.TempDir == "" {
		cfg.Snapshots.TempDir = filepath.Join(cfg.DataDir, "tmp")
	}
	if err := os.MkdirAll(cfg.Snapshots.TempDir, 0o700); err != nil {
		st.Close()
		return nil, err
	}
	quotas, err := openQuota(ctx, cfg, log)
	if err != nil {
		st.Close()
		return nil, err
	}
	diskCapacityMB, err := machineLimits(&cfg, filepath.Join(cfg.DataDir, "workspaces"), log)
	if err != nil {
		st.Close()
		return nil, err
	}
	replica := replicaName()
	leader := &leadership{store: st, holder: replica, log: log}
	// Alive before anything runs: other replicas leave what this one owns.
	if err := heartbeat(ctx, st, replica); err != nil {
		st.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	// An SQLite file has one server. Other stores may be shared: then
	// this process is one replica among others, which leave what it owns
	// alone while it lives.
	_, local := st.(*sqlite.Store)
	var sessionReplica string
	var isAlive func(ctx context.Context, owner string) (bool, error)
	if !local {
		sessionReplica = replica
		isAlive = func(ctx context.Context, owner string) (bool, error) { return alive(ctx, st, owner) }
	}
	evlog, hooks := openEvents(cfg.Events, st, !local, leader, log)
	var publish func(context.Context, events.Event)
	var emit func(events.Event)
	if evlog != nil {
		publish, emit = evlog.Record, evlog.Emit
	}
	var metrics *server.Metrics
	var sampler *usage.Sampler // made after the manager, whose sandboxes it samples
	// One content-addressed store with one collector (the session
	// reaper's, on the leader): snapshots, hibernated workspaces, resource
	// content and presigned copies.
	snaps := snapshot.New(blobs, "snapshots", cfg.Snapshots)
	// Archive-saved manifests (a workspace streamed from its sandbox) carry
	// the sandbox's ids; these are the host's for them.
	snaps.MapIDs(snapshot.IDs{Root: snapshot.ID(owners.Root), User: snapshot.ID(owners.User)})
	if !local {
		// Replicas save, restore and put objects while the leader
		// collects: a fence in the store keeps the two apart.
		snaps.ShareWith(store.NewRWLock(st, "blob-collect", replica))
	}
	// The tenants' templates: their records in the store, their builds
	// and build logs on this server.
	var registryAlive func(ctx context.Context, replica string) (bool, error)
	if !local {
		registryAlive = isAlive
	}
	// The session maximum is configured as the API writes resources; the
	// session and the registry hold it to the built-in maxima.
	sessionMax := session.Resources{CPU: cfg.MaxResources.CPU, MemoryMB: cfg.MaxResources.Memory, DiskMB: cfg.MaxResources.Disk}
	c := session.CapResources(sessionMax)
	capped := api.Resources{CPU: c.CPU, Memory: c.MemoryMB, Disk: c.DiskMB}
	reg := registry.New(registry.Config{
		Templates: templates, Store: st, Replica: replica, Alive: registryAlive,
		Builds: cfg.TemplateBuilds, LogDir: filepath.Join(cfg.DataDir, "template-logs"), Log: log,
		MaxResources: capped,
	})
	limitsOf := func(tenant string) session.Limits {
		if l, ok := cfg.TenantLimits[tenant]; ok {
			return l
		}
		return cfg.Limits
	}
	var workspaces workspace.Store
	if pods != nil {
		workspaces = pods.Volumes(snaps, 0)
	}
	mgr := session.New(session.Options{
		Workspaces: workspaces,
		Store:      st, Templates: templates, Resolve: reg.Resolve, NotBuilt: reg.NotBuilt, Runtime: newRuntime,
		WorkspaceDir: filepath.Join(cfg.DataDir, "workspaces"), Quota: quotas, Owners: owners, Log: log,
		Defaults: cfg.Defaults, MaxSandboxes: cfg.MaxSandboxes, ReapInterval: cfg.ReapInterval,
		Snapshots: snaps, Pools: cfg.Pools,
		// A tenant's resource content is in its own namespace, which
		// Snapshots.Prefixes counts; its presigned copies are in another.
		StoredPrefixes: func(tenant string) []string { return snaps.Prefixes(server.PresignNamespace(key, tenant)) },
		Instance:       instance,
		Replica:        sessionReplica,
		Alive:          isAlive,
		Leader:         leader.held,
		Limits:         limitsOf,
		MaxResources:   sessionMax,
		DiskCapacityMB: diskCapacityMB,
		Publish:        publish,
		Events: func(ev string) {
			if metrics != nil {
				metrics.SessionEvent(ev)
			}
		},
		Reaped: func(took time.Duration, acted int) {
			if metrics != nil {
				metrics.Reaped(took, acted)
			}
		},
		Destroying: func(ctx context.Context, rt runtime.Runtime, id string) {
			if sampler != nil {
				sampler.Final(ctx, rt, id)
			}
		},
	})
	disk := func(ctx context.Context, volume string) (int64, int64, error) {
		dir, err := volumes.VolumeDir(ctx, volume)
		if err != nil {
			return 0, 0, err
		}
		return quotas.Usage(ctx, dir)
	}
	if pods != nil {
		disk = nil // no workspace on this host: the Pod's stats say it
	}
	sampler = usage.New(usage.Config{
		Held: mgr.Held, Disk: disk, Interval: cfg.MetricsInterval, Keep: cfg.MetricsHistory, Log: log,
	})
	metrics = server.NewMetrics(st, mgr)
	metrics.RegisterUsage(sampler)
	// What an SQLite server finds unfinished at start is a previous
	// process's, failed at once (Alive nil).
	execs := execution.New(execution.Options{Store: st, Sessions: mgr, Log: log, Finished: metrics.ExecutionFinished, Owner: replica, Alive: isAlive, Publish: emit})
	fail := func(err error) (*App, error) {
		execs.Close()
		mgr.Close()
		reg.Close()
		if evlog != nil {
			evlog.Close()
		}
		st.Close()
		return nil, err
	}
	if err := execs.Recover(ctx); err != nil {
		return fail(fmt.Errorf("recovering executions: %w", err))
	}
	if err := mgr.Start(ctx); err != nil {
		return fail(fmt.Errorf("reconciling sessions with sandboxes: %w", err))
	}
	var chatLoop *chat.Chat
	if cfg.Chat.BaseURL != "" {
		if cfg.Chat.Log == nil {
			cfg.Chat.Log = log
		}
		if chatLoop, err = chat.New(cfg.Chat, st); err != nil {
			return fail(err)
		}
	}
	sampler.Start()
	// Every front door's file call goes through the one file policy.
	policy := files.New(files.Options{Sessions: mgr, Uploads: st, Log: log})
	srv := server.New(server.Options{
		Chat: chatLoop, Limits: limitsOf,
		Store: st, Sessions: mgr, Files: policy, Executions: execs, Blobs: blobs, Objects: snaps, Templates: reg, Usage: sampler, Keys: cfg.Keys, SigningKey: key,
		E2BTokenTTL: cfg.E2BTokenTTL, PresignMaxBytes: cfg.PresignMaxBytes, Metrics: metrics, MetricsToken: cfg.MetricsToken, Log: log, Version: cfg.Version, Edge: cfg.Edge,
		Events: evlog, EventPoll: cfg.Events.Poll, Webhooks: hooks,
		Ready: func() map[string]error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := newRuntime("")
			return map[string]error{"blob": blobReady(ctx, blobs), "runtime": err}
		},
	})
	mgr.Prebuild(cfg.Prebuild)
	app := &App{Server: srv, Store: st, Sessions: mgr, Execs: execs, Templates: reg, Usage: sampler, log: log, leader: leader, replica: replica, stop: make(chan struct{}),
		events: evlog, webhooks: hooks, retention: cfg.Events.Retention, pods: pods}
	if evlog != nil {
		hooks.Start()
	}
	app.wg.Add(1)
	go app.beat()
	return app, nil
}

// Close stops the background work and closes the store. Sandboxes stay
// up for the next process to reattach to.
func (a *App) Close() {
	a.closeOnce.Do(a.close)
}

func (a *App) close() {
	close(a.stop)
	a.wg.Wait()
	a.Server.Shutdown()
	a.webhooks.Close()
	a.Usage.Close()
	a.Execs.Close()
	a.Sessions.Close()
	if a.pods != nil {
		a.pods.Close() // its pools' watch, its executors' connections, its API server's
	}
	a.Templates.Close()
	if a.events != nil {
		a.events.Close() // after what emits, so that their last events go in
	}
	a.leader.release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	a.Store.ReleaseLease(ctx, replicaLease(a.replica), a.replica)
	cancel()
	a.Store.Close()
}

// Serve listens on addr and serves until ctx is done, then shuts down
// gracefully.
func (a *App) Serve(ctx context.Context, ln net.Listener) error {
	hs := a.Server.HTTPServer()
	hs.ErrorLog = slog.NewLogLogger(a.log.Handler(), slog.LevelWarn)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := hs.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		hs.Close()
	}
	return nil
}

// CheckAddr refuses a non-loopback address when there are no API keys.
func CheckAddr(addr string, keys server.Keys) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if len(keys) > 0 {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to listen on %s without API keys: anyone who can reach it could run code; give --api-key KEY[:TENANT] (or SBX_API_KEYS) or listen on 127.0.0.1", addr)
}

// instanceID reads the name of this deployment (the servers sharing a
// data directory), making it on first use: its sandboxes are labelled
// with it, so that a server with another data directory, sharing the
// runtime's state directory, leaves them alone.
func instanceID(path string) (string, error) {
	for range 100 {
		b, err := os.ReadFile(path)
		if id := strings.TrimSpace(string(b)); err == nil && len(id) == 16 {
			return id, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		// O_EXCL: of two servers starting at once on a new data
		// directory, one makes the name and the other reads it.
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			return "", err
		}
		b = make([]byte, 8)
		rand.Read(b)
		id := hex.EncodeToString(b)
		_, err = f.WriteString(id + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return id, err
	}
	return "", fmt.Errorf("%s does not hold an instance name (16 hex digits); remove it if no server uses this data directory", path)
}

// signingKey reads the key that signs presigned URLs and E2B tokens,
// making it on first use. It survives restarts so that URLs handed out
// stay valid. Replicas share it: of two starting at once on a new data
// directory, one makes it and the other reads that one (it appears whole,
// by a hard link, or not at all), or each would sign what the other
// refuses.
func signingKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err == nil { // short: made by an sbx that wrote it in place, and cut off
		return nil, fmt.Errorf("%s holds %d bytes, not a key of 32 or more; remove it if no server uses this data directory (presigned URLs handed out stop working)", path, len(b))
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".signing.key-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	b = make([]byte, 32)
	rand.Read(b)
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	if err := os.Link(f.Name(), path); errors.Is(err, fs.ErrExist) {
		return signingKey(path) // another made it first
	} else if err != nil {
		return nil, err
	}
	return b, nil
}
