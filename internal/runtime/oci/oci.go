// Package oci runs sandboxes as OCI containers through a runtime binary:
// runc (the default), crun or gVisor's runsc. It writes a bundle per sandbox
// (config.json generated from the runtime-spec Go types), starts the
// executor as the container's PID 1 and talks to it over a unix socket in a
// control directory bind-mounted into the container. A Spec's image and
// volume are names, which the resolvers of Config turn into this host's
// directories (the template store's build, the workspace). It has every
// optional capability of the runtime contract: Pauser (the cgroup
// freezer), StatsReader (the cgroups) and HostProcesses.
package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

// Config configures the OCI driver. Zero fields take the documented
// defaults.
type Config struct {
	// Runtime is the OCI runtime: "runc" (default), "crun" or "runsc". A
	// name is looked up in PATH; a path is used as is.
	Runtime string
	// StateDir holds bundles (StateDir/sandboxes/ID), the runtime's own
	// state (StateDir/<runtime>) and the executor binary mounted into every
	// sandbox (StateDir/bin). Default: /run/sbx. It lives on a tmpfs on
	// purpose: containers do not survive a reboot, so neither should their
	// state.
	StateDir string
	// ExecutorPath is the static sbx-executor binary on the host. Default:
	// sbx-executor beside the running executable, then in PATH.
	ExecutorPath string
	// CgroupParent is the cgroup under which every sandbox gets its own.
	// Default: sbx.
	CgroupParent string
	// UIDShift is the first storage id: the host uid (and gid) that owns,
	// on disk, what root inside a sandbox owns; UIDRange ids from there.
	// Defaults: 100000 and 65536. Template rootfs builds are shifted by the
	// same amount, and the control plane writes workspace files as
	// UIDShift+1000. No sandbox runs as these ids (see ids.go).
	UIDShift uint32
	UIDRange uint32
	// IDBase is the first host uid of the sandboxes' own id ranges: the
	// sandbox in slot n runs as IDBase+n*UIDRange and up. Default 1<<24.
	IDBase uint32
	// IDSlots is how many sandboxes can have ranges at once, host-wide.
	// Default 4096.
	IDSlots int
	// IDDir holds the host-wide claims of id slots, shared by every sbx on
	// the host whatever its StateDir. Default /run/sbx-ids.
	IDDir string
	// RunscFlags are global flags for runsc. Default: --platform=systrap
	// --network=none (see runtime-facts.md: gVisor needs them on every
	// subcommand). The driver always adds --host-uds=create (the executor's
	// socket must be a host socket) and --oci-seccomp after them; see
	// runsc.go.
	RunscFlags []string
	// ReadyTimeout bounds how long Create waits for the executor to answer.
	// Default: 30s.
	ReadyTimeout time.Duration
	// Log receives the driver's logs. Default: slog.Default().
	Log *slog.Logger
	// JobsOnly: the runtime will run jobs (RunJob: template builds) and no
	// sandbox, so it needs no executor binary.
	JobsOnly bool
	// Images resolves a Spec's image reference to the root filesystem of
	// the template build (template.Store). Create needs it; a runtime
	// made to list, inspect or destroy sandboxes does not.
	Images Images
	// Volumes resolves a Spec's volume name to its directory
	// (workspace.Dirs, workspace.Volumes), as Images.
	Volumes Volumes
}

// Images resolves image references to root filesystems on this host.
// A reference is input: a resolver checks its form (no "..", no absolute
// path, a bounded length) and answers errdefs.ErrInvalidArgument for a
// malformed one and errdefs.ErrNotFound for one it does not have.
type Images interface {
	ImageRootfs(ctx context.Context, ref string) (string, error)
}

// Volumes resolves volume names to directories on this host, with the
// same care as Images.
type Volumes interface {
	VolumeDir(ctx context.Context, name string) (string, error)
}

// Runtime is the OCI driver.
type Runtime struct {
	cfg    Config
	ids    *idSlots
	name   string // runc, crun or runsc
	binary string // resolved path of the runtime binary
	global []string
	log    *slog.Logger
	jobsState
}

var (
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.Pauser        = (*Runtime)(nil)
	_ runtime.StatsReader   = (*Runtime)(nil)
	_ runtime.HostProcesses = (*Runtime)(nil)
)

// validID is what a sandbox id may look like. It ends up in paths, cgroup
// names and the runtime's command line, and the socket path it is part of
// must stay under the 108-byte limit of unix socket addresses.
var validID = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$`)

// quoteID quotes an id that is not valid for an error message, cut short:
// it is the caller's input, of any length.
func quoteID(id string) string {
	if len(id) > 80 {
		return strconv.Quote(id[:80]) + "..."
	}
	return strconv.Quote(id)
}

// DefaultOwners is Owners for the default UIDShift.
func DefaultOwners() (root, user int) { return 100000, 100000 + sandboxUID }

// Owners returns the host uids of root inside a sandbox and of the user
// code runs as: files the control plane puts into a workspace get one of
// them (the user's to be the code's own, root's to be read-only to it).
func (r *Runtime) Owners() (root, user int) {
	return int(r.cfg.UIDShift), int(r.cfg.UIDShift) + sandboxUID
}

// New checks that the runtime binary exists and can work on this machine,
// and prepares the state directory.
func New(cfg Config) (*Runtime, error) {
	if cfg.Runtime == "" {
		cfg.Runtime = "runc"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "/run/sbx"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "sbx"
	}
	if cfg.UIDShift == 0 {
		cfg.UIDShift = 100000
	}
	if cfg.UIDRange == 0 {
		cfg.UIDRange = 65536
	}
	if cfg.IDBase == 0 {
		cfg.IDBase = 1 << 24
	}
	if cfg.IDSlots == 0 {
		cfg.IDSlots = 4096
	}
	if cfg.IDDir == "" {
		cfg.IDDir = "/run/sbx-ids"
	}
	if uint64(cfg.IDBase)+uint64(cfg.IDSlots)*uint64(cfg.UIDRange) > 1<<32-2 {
		return nil, fmt.Errorf("oci: id ranges from %d, %d of %d ids, run past the last uid: %w", cfg.IDBase, cfg.IDSlots, cfg.UIDRange, errdefs.ErrInvalidArgument)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	r := &Runtime{cfg: cfg, name: filepath.Base(cfg.Runtime), log: cfg.Log,
		ids: &idSlots{dir: cfg.IDDir, base: cfg.IDBase, size: cfg.UIDRange, count: cfg.IDSlots, storage: cfg.UIDShift}}
	bin, err := exec.LookPath(cfg.Runtime)
	if err != nil {
		return nil, fmt.Errorf("OCI runtime %q is not installed (apt-get install %s): %w", cfg.Runtime, debianPackage(r.name), errdefs.ErrUnavailable)
	}
	r.binary = bin
	switch r.name {
	case "runc":
	case "crun":
		if err := crunSupported(); err != nil {
			return nil, err
		}
	case "runsc":
		r.global = runscFlags(cfg.RunscFlags)
	default:
		return nil, fmt.Errorf("OCI runtime %q: want runc, crun or runsc: %w", cfg.Runtime, errdefs.ErrInvalidArgument)
	}
	r.global = append([]string{"--root", filepath.Join(cfg.StateDir, r.name)}, r.global...)
	if err := r.prepareStateDir(); err != nil {
		return nil, err
	}
	return r, nil
}

// Name is the runtime's name: runc, crun or runsc.
func (r *Runtime) Name() string { return r.name }

func debianPackage(name string) string {
	if name == "runsc" {
		return "-t bookworm-backports runsc"
	}
	return name
}

// crunSupported reports crun's known failure on this kind of machine: crun
// refuses cgroup v1 "hybrid" hierarchies whose cgroup2 mount has
// controllers enabled (see runtime-facts.md), and says so only when a
// container starts. Finding it here gives a clear error up front.
func crunSupported() error {
	b, err := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	if err != nil {
		return nil // not hybrid: pure v1 or pure v2
	}
	if ctrls := strings.Fields(string(b)); len(ctrls) > 0 {
		return fmt.Errorf("crun does not support this machine's cgroup layout: cgroup v1 with controllers (%s) on the hybrid cgroup2 mount; use runc or runsc: %w",
			strings.Join(ctrls, ", "), errdefs.ErrUnavailable)
	}
	return nil
}

func (r *Runtime) prepareStateDir() error {
	for _, d := range []string{r.cfg.StateDir, filepath.Join(r.cfg.StateDir, "sandboxes"), filepath.Join(r.cfg.StateDir, "bin")} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
		// Every sandbox's ids must traverse to its bundle's rootfs. A dir
		// made before, by `runc --root STATE/runc` (0700) say, would
		// make every start fail with EACCES.
		if err := os.Chmod(d, 0o711); err != nil {
			return fmt.Errorf("state dir: %w", err)
		}
	}
	if r.cfg.JobsOnly {
		return nil
	}
	exe := r.cfg.ExecutorPath
	if exe == "" {
		var err error
		if exe, err = FindExecutor(); err != nil {
			return err
		}
	}
	return installExecutor(exe, filepath.Join(r.cfg.StateDir, "bin", "sbx-executor"))
}

// FindExecutor looks for sbx-executor beside the running binary, then in
// PATH.
func FindExecutor() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "sbx-executor")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("sbx-executor"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("sbx-executor not found beside %s or in PATH (make build): %w", os.Args[0], errdefs.ErrUnavailable)
}

// installExecutor copies the executor binary into the directory mounted
// into sandboxes, so that rebuilding the binary under a running server
// neither breaks running sandboxes nor needs the build tree to be readable
// by the sandboxes' unprivileged uids. Running sandboxes keep the old inode.
func installExecutor(src, dst string) error {
	want, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, want) {
		return nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, want, 0o755); err != nil {
		return fmt.Errorf("executor: %w", err)
	}
	return os.Rename(tmp, dst)
}

func (r *Runtime) bundle(id string) string {
	return filepath.Join(r.cfg.StateDir, "sandboxes", id)
}

// record is what a bundle remembers about its sandbox, so that List and
// Inspect work for sandboxes a previous server process started.
type record struct {
	runtime.Info
	// IDSlot and IDBase are the sandbox's host ids (ids.go); IDBase 0: a
	// sandbox made before sandboxes had their own.
	IDSlot int    `json:"id_slot"`
	IDBase uint32 `json:"id_base,omitempty"`
}

// Create starts a sandbox and waits until its executor answers.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ *runtime.Info, err error) {
	if !validID.MatchString(spec.ID) {
		return nil, fmt.Errorf("sandbox id %s: want 1-64 of [a-zA-Z0-9_-]: %w", quoteID(spec.ID), errdefs.ErrInvalidArgument)
	}
	if spec.Network {
		return nil, fmt.Errorf("sandbox %s: network access is not supported yet: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if r.cfg.Images == nil || r.cfg.Volumes == nil {
		return nil, fmt.Errorf("sandbox %s: the runtime was given no image or volume resolver (oci.Config): %w", spec.ID, errdefs.ErrFailedPrecondition)
	}
	rootfsDir, err := r.cfg.Images.ImageRootfs(ctx, spec.Image)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	wsDir, err := r.cfg.Volumes.VolumeDir(ctx, spec.Volume)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	for _, p := range []string{rootfsDir, wsDir} {
		if fi, err := os.Stat(p); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("sandbox %s: %s is not a directory: %w", spec.ID, p, errdefs.ErrNotFound)
		}
	}
	res := spec.Resources.WithDefaults()
	b := r.bundle(spec.ID)
	if err := os.Mkdir(b, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
		}
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			if derr := r.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				r.log.Warn("cleanup after failed create", "sandbox", spec.ID, "err", derr)
			}
		}
	}()

	slot, err := r.ids.claim(b)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	base := r.ids.hostBase(slot)
	info := runtime.Info{
		ID: spec.ID, State: runtime.StateCreating, Runtime: r.name,
		Image: spec.Image, Volume: spec.Volume, Resources: res,
		Labels: spec.Labels, CreatedAt: time.Now().UTC(),
	}
	if err := writeJSON(filepath.Join(b, "sandbox.json"), record{Info: info, IDSlot: slot, IDBase: base}); err != nil {
		return nil, err
	}
	userns, err := r.ids.usernsFor(slot)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	root := int(base) // the sandbox's root on the host
	if err := r.shareBundle(b, root); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	ctl := filepath.Join(b, "ctl")
	if err := os.Mkdir(ctl, 0o700); err != nil {
		return nil, err
	}
	if err := mountControlDir(ctl, root); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	// On disk the workspace belongs to the storage ids; the sandbox sees
	// it as its own through its idmapped mount.
	storage := int(r.cfg.UIDShift)
	if err := prepareWorkspace(ctx, wsDir, storage+sandboxUID, storage+sandboxUID, storage); err != nil {
		return nil, fmt.Errorf("sandbox %s: workspace: %w", spec.ID, err)
	}
	// The variables user code gets travel in a file only the sandbox's
	// root reads, never in the executor's environment (see readEnvFile in
	// cmd/sbx-executor).
	envFile := filepath.Join(ctl, "env.json")
	if err := writeJSON(envFile, userEnv(spec.Env)); err != nil {
		return nil, err
	}
	if err := os.Chown(envFile, root, root); err != nil {
		return nil, err
	}
	// The rootfs read-only, the workspace read-write, both through the
	// sandbox's idmapping (rootfs.go).
	rootfs, ws := filepath.Join(b, "rootfs"), filepath.Join(b, "workspace")
	for _, m := range []struct {
		src, dst string
		ro       bool
	}{{rootfsDir, rootfs, true}, {wsDir, ws, false}} {
		if err := os.Mkdir(m.dst, 0o755); err != nil {
			return nil, err
		}
		if err := bindMount(m.src, m.dst, userns, m.ro); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", spec.ID, err)
		}
	}
	cfg := ociSpec(bundleConfig{
		runtime: r.name, spec: spec, rootfs: rootfs, workspace: ws, res: res, controlDir: ctl,
		binDir:   filepath.Join(r.cfg.StateDir, "bin"),
		uidShift: base, uidRange: r.cfg.UIDRange,
		cgroupPath: sandboxCgroup(r.cfg.CgroupParent, spec.ID),
	})
	if err := writeJSON(filepath.Join(b, "config.json"), cfg); err != nil {
		return nil, err
	}

	// The executor's own stdout and stderr go to a log file in the bundle:
	// they carry its logs, never user output (that goes over the socket).
	logf, err := os.OpenFile(filepath.Join(b, "executor.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := []string{"run", "--detach", "--bundle", b, "--pid-file", filepath.Join(b, "pid")}
	if r.name != "runsc" {
		// A new session keyring per container counts against the mapped
		// root's key quota (kernel.keys.maxkeys, 200 by default): past
		// about 200 sandboxes every start failed with "disk quota
		// exceeded". Sandboxed code cannot use keyrings anyway (keyctl,
		// add_key and request_key are outside the seccomp allowlist), and
		// gVisor has no host keyrings to begin with.
		args = append(args, "--no-new-keyring")
	}
	if out, err := r.run(ctx, logf, append(args, spec.ID)...); err != nil {
		return nil, fmt.Errorf("sandbox %s: %s run: %v: %s%s: %w", spec.ID, r.name, err, out, r.logTail(spec.ID), errdefs.ErrUnavailable)
	}
	if err := r.waitExecutor(ctx, spec.ID); err != nil {
		return nil, err
	}
	info.State = runtime.StateRunning
	return &info, nil
}

// waitExecutor waits until the executor accepts connections on its socket.
// Polling is cheap here (the socket appears within milliseconds, and a
// refused connect costs microseconds) and needs nothing from inside the
// sandbox.
func (r *Runtime) waitExecutor(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ReadyTimeout)
	defer cancel()
	delay := 250 * time.Microsecond
	for {
		c, err := dialExecutor(ctx, r.bundle(id))
		if err == nil {
			c.Close()
			return nil
		}
		// A container whose init died will never answer. (runsc's pid file
		// names the sandbox process, which lives in the cgroup too.)
		if _, alive := r.initProcess(id); !alive {
			return fmt.Errorf("sandbox %s: executor exited during start%s: %w", id, r.logTail(id), errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: executor did not start: %v%s: %w", id, err, r.logTail(id), errdefs.ErrUnavailable)
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Millisecond)
	}
}

// initProcess returns the pid of the sandbox's init process if it is alive.
// The pid file may be stale after a crash and pids are reused, so the
// process must also sit in the sandbox's cgroup. A zombie counts as dead:
// the init of a PID namespace becomes one only after every other process
// of the namespace is gone, and who reaps it (the host's init, since the
// runtime detached it) may take its time.
func (r *Runtime) initProcess(id string) (int, bool) {
	return r.initIn(r.bundle(id), id)
}

// initIn is initProcess for the container id whose bundle is bundle (a
// sandbox's, or a job's).
func (r *Runtime) initIn(bundle, id string) (int, bool) {
	pid := readPid(bundle)
	if pid <= 0 {
		return 0, false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return 0, false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, false
	}
	want := ":" + sandboxCgroup(r.cfg.CgroupParent, id)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasSuffix(line, want) {
			return pid, true
		}
	}
	return 0, false
}

// freeze pauses or resumes a runc or crun sandbox through its freezer
// cgroup, without the two runtime processes (state, then pause) the CLI
// path costs: a few hundred microseconds instead of tens of milliseconds.
// It reports false, with no error, when there is no freezer to write and
// the caller should go through the CLI.
func (r *Runtime) freeze(ctx context.Context, id string, on bool, from string) (bool, error) {
	if !validID.MatchString(id) {
		return true, fmt.Errorf("sandbox %s: %w", quoteID(id), errdefs.ErrNotFound)
	}
	if _, err := os.Stat(r.bundle(id)); errors.Is(err, os.ErrNotExist) {
		return true, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	verb := map[bool]string{true: "pause", false: "resume"}[on]
	if _, alive := r.initProcess(id); !alive {
		return true, &runtime.StateError{ID: id, Op: verb, State: runtime.StateStopped}
	}
	state := "running"
	if frozen(r.cfg.CgroupParent, id) {
		state = "paused"
	}
	if state != from {
		return true, &runtime.StateError{ID: id, Op: verb, State: runtime.State(state)}
	}
	ok, err := setFrozen(ctx, r.cfg.CgroupParent, id, on)
	if err != nil {
		return true, fmt.Errorf("sandbox %s: %s: %v: %w", id, verb, err, errdefs.ErrUnavailable)
	}
	return ok, nil
}

// killInit is the fast way to stop a runc or crun sandbox: SIGKILL its init
// (the PID namespace dies with it) and watch it go. `runc delete --force`
// does the same but polls every 100 ms. It reports whether it found the
// init to kill.
func (r *Runtime) killInit(ctx context.Context, id string) (bool, error) {
	if r.name == "runsc" {
		return false, nil // the sandbox process is gVisor's, not ours to kill
	}
	pid, ok := r.initProcess(id)
	if !ok {
		return false, nil
	}
	if frozen(r.cfg.CgroupParent, id) {
		// A frozen process cannot die; thaw it so SIGKILL is delivered.
		if _, err := setFrozen(ctx, r.cfg.CgroupParent, id, false); err != nil {
			return true, fmt.Errorf("sandbox %s: thaw to stop: %w", id, err)
		}
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
		return true, fmt.Errorf("sandbox %s: kill: %w", id, err)
	}
	for delay := 100 * time.Microsecond; ; delay = min(2*delay, 10*time.Millisecond) {
		if _, alive := r.initProcess(id); !alive {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return true, fmt.Errorf("sandbox %s: waiting for it to stop: %w", id, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// logTail is the end of the executor's log, for error messages: what
// runc's stdout and stderr caught in the bundle (the executor's words
// before it opened its own log, and runc's), then the end of the log the
// executor keeps in its control directory. Each is read by seeking to its
// last bytes: the sandbox writes them, so their size is not the host's to
// trust.
func (r *Runtime) logTail(id string) string {
	b := r.bundle(id)
	var parts []string
	for _, p := range []struct{ dir, name string }{{b, "executor.log"}, {filepath.Join(b, "ctl"), executorLogName}} {
		if t := strings.TrimSpace(string(readTail(p.dir, p.name, 2048))); t != "" {
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; executor log: " + strings.Join(parts, "\n")
}

// readTail reads at most the last n bytes of dir/name, without following a
// symlink there.
func readTail(dir, name string, n int64) []byte {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	off := max(fi.Size()-n, 0)
	buf := make([]byte, min(n, fi.Size()))
	k, _ := f.ReadAt(buf, off)
	return buf[:k]
}

// Dial connects to the sandbox's executor.
func (r *Runtime) Dial(ctx context.Context, id string) (net.Conn, error) {
	if !validID.MatchString(id) {
		return nil, fmt.Errorf("sandbox %s: %w", quoteID(id), errdefs.ErrNotFound)
	}
	c, err := dialExecutor(ctx, r.bundle(id))
	if err != nil {
		if _, serr := os.Stat(r.bundle(id)); errors.Is(serr, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox %s: executor: %v: %w", id, err, errdefs.ErrUnavailable)
	}
	return c, nil
}

// Pause freezes the sandbox (cgroup freezer).
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.transition(ctx, id, "pause", "running")
}

// Resume thaws a paused sandbox.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.transition(ctx, id, "resume", "paused")
}

func (r *Runtime) transition(ctx context.Context, id, verb, from string) error {
	if r.name != "runsc" { // gVisor freezes its own way, through runsc
		if done, err := r.freeze(ctx, id, verb == "pause", from); done || err != nil {
			return err
		}
	}
	st, err := r.state(ctx, id)
	if err != nil {
		return err
	}
	if st.Status != from {
		return &runtime.StateError{ID: id, Op: verb, State: runtime.State(st.Status)}
	}
	if out, err := r.run(ctx, nil, verb, id); err != nil {
		return fmt.Errorf("sandbox %s: %s %s: %v: %s: %w", id, r.name, verb, err, out, errdefs.ErrUnavailable)
	}
	return nil
}

// Stop kills every process of the sandbox and waits until it has stopped.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if found, err := r.killInit(ctx, id); found {
		return err
	}
	st, err := r.state(ctx, id)
	if err != nil {
		return err
	}
	switch st.Status {
	case "stopped":
		return nil
	case "paused":
		if out, err := r.run(ctx, nil, "resume", id); err != nil {
			return fmt.Errorf("sandbox %s: resume to stop: %v: %s", id, err, out)
		}
	}
	// runsc's "stopped" is a guess when its sandbox does not answer in
	// time (runsc state signals the container and takes an error for its
	// end), so under load it can say stopped while the container runs.
	// The sandbox process (the pid it reports while running) exits with
	// the container's init: that is what ends a runsc Stop.
	sandboxPid := 0
	if r.name == "runsc" {
		sandboxPid = st.Pid
	}
	stopped := func(st *ociStateJSON) bool {
		return st.Status == "stopped" && (sandboxPid <= 0 || !processAlive(sandboxPid))
	}
	if out, err := r.run(ctx, nil, "kill", "--all", id, "KILL"); err != nil {
		if st, serr := r.state(ctx, id); serr == nil && stopped(st) {
			return nil
		}
		return fmt.Errorf("sandbox %s: %s kill: %v: %s", id, r.name, err, out)
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		st, err := r.state(ctx, id)
		if err != nil || stopped(st) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// processAlive says whether pid is a process that has not exited (a
// zombie has).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) S ...: the state follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// Destroy kills the sandbox and removes its runtime state, cgroups and
// bundle. The workspace is the caller's and is left alone.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	if !validID.MatchString(id) {
		return nil // nothing by that name can exist
	}
	if _, err := r.killInit(ctx, id); err != nil {
		return err
	}
	if out, err := r.run(ctx, nil, "delete", "--force", id); err != nil && !notExist(out) {
		return fmt.Errorf("sandbox %s: %s delete: %v: %s", id, r.name, err, out)
	}
	if err := removeCgroups(r.cfg.CgroupParent, id); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	var rec record
	recErr := readJSON(filepath.Join(r.bundle(id), "sandbox.json"), &rec)
	if err := removeBundle(r.bundle(id)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if slot := slotFromRecord(&rec); recErr == nil && slot >= 0 {
		if err := r.ids.release(slot, r.bundle(id)); err != nil {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	return nil
}

// Inspect reports one sandbox.
func (r *Runtime) Inspect(ctx context.Context, id string) (*runtime.Info, error) {
	info, err := r.record(id)
	if err != nil {
		return nil, err
	}
	st, err := r.state(ctx, id)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		// The bundle is here but the runtime forgot the container (a
		// crash between the two, or a reboot): it is not running.
		info.State = runtime.StateStopped
	case err != nil:
		return nil, err
	default:
		info.State = ociState(st.Status)
	}
	return info, nil
}

// Pid is the host pid of the sandbox's init (runc: the executor; runsc:
// the sandbox process), 0 if it has none alive.
func (r *Runtime) Pid(ctx context.Context, id string) (int, error) {
	if _, err := r.record(id); err != nil {
		return 0, err
	}
	pid, _ := r.initProcess(id)
	return pid, nil
}

// record reads what the sandbox's bundle remembers of it (its state
// excepted); ErrNotFound if it has no bundle.
func (r *Runtime) record(id string) (*runtime.Info, error) {
	if !validID.MatchString(id) {
		return nil, fmt.Errorf("sandbox %s: %w", quoteID(id), errdefs.ErrNotFound)
	}
	var rec record
	if err := readJSON(filepath.Join(r.bundle(id), "sandbox.json"), &rec); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		return nil, err
	}
	return &rec.Info, nil
}

// List reports every sandbox that has a bundle.
func (r *Runtime) List(ctx context.Context) ([]runtime.Info, error) {
	ents, err := os.ReadDir(filepath.Join(r.cfg.StateDir, "sandboxes"))
	if err != nil {
		return nil, err
	}
	var out []runtime.Info
	for _, e := range ents {
		info, err := r.Inspect(ctx, e.Name())
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // gone since ReadDir, or a half-made bundle
		}
		if err != nil {
			return nil, err
		}
		out = append(out, *info)
	}
	return out, nil
}

// Stats reads the sandbox's cgroups (and, for runsc, counts its tasks
// inside gVisor: see runscTasks). Under runc and crun it runs no command:
// the bundle's record says the sandbox exists and what it was given, and
// the cgroups say the rest (a `runc state` costs a process start, about
// 4 ms here, and the usage sampler asks every few seconds for every
// sandbox).
func (r *Runtime) Stats(ctx context.Context, id string) (*runtime.Stats, error) {
	var info *runtime.Info
	var err error
	if r.name == "runsc" {
		info, err = r.Inspect(ctx, id)
	} else {
		info, err = r.record(id)
	}
	if err != nil {
		return nil, err
	}
	st, err := readCgroupStats(r.cfg.CgroupParent, id)
	if err != nil {
		return nil, err
	}
	st.Limits = info.Resources
	if r.name == "runsc" {
		st.PIDs, err = r.runscTasks(ctx, id, info.State)
	}
	return st, err
}

// dialExecutor connects to the executor's socket in the bundle's control
// directory. That directory is the sandbox's (its root owns it), so the
// name executor.sock may be anything the sandbox put there: a symlink to
// another sandbox's socket, or to a socket of the host's, would have a
// plain connect(2) by path follow it. The socket is opened without
// following links, checked to be a socket, and connected through its
// descriptor's /proc link, which names that inode and nothing else.
func dialExecutor(ctx context.Context, bundle string) (net.Conn, error) {
	dir, err := unix.Open(filepath.Join(bundle, "ctl"), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(bundle, "ctl"), Err: err}
	}
	defer unix.Close(dir)
	fd, err := unix.Openat(dir, "executor.sock", unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: "executor.sock", Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("executor.sock is not a socket (mode %#o): something in the sandbox replaced it", st.Mode)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
}
