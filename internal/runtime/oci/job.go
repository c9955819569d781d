package oci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
)

// Jobs (runtime.Job) are one-shot containers for template builds. They
// are made like sandboxes (an id slot of their own, idmapped mounts, a
// cgroup, seccomp, every namespace) but run in the foreground, with the
// caller's standard streams, and are gone when RunJob returns. Their
// bundles are StateDir/jobs/ID and the runtime keeps their state under a
// root of its own (StateDir/jobs-RUNTIME), so that no sandbox listing ever
// sees them.
//
// A build needs what package installation needs, inside its own user
// namespace only: to own and chown files, to switch users (apt drops to
// _apt), to chroot (debootstrap's second stage runs every command through
// chroot, into / here) and to set file capabilities. None of it is
// anything on the host: root in a job is a host uid of its own slot, and
// on disk its files belong to the storage ids through the idmapping.
var jobCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
	"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_SETFCAP", "CAP_SYS_CHROOT",
	"CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE",
}

// jobIDPrefix starts every job's id.
const jobIDPrefix = "job-"

func (r *Runtime) jobsDir() string { return filepath.Join(r.cfg.StateDir, "jobs") }

// jobGlobal are the runtime's global flags for jobs: their own state root.
func (r *Runtime) jobGlobal() []string {
	return []string{"--root", filepath.Join(r.cfg.StateDir, "jobs-"+r.name)}
}

// jobRecord is job.json in a job's bundle: what a sweep needs to clean up
// after a process that died running the job.
type jobRecord struct {
	Owner  int    `json:"owner"` // pid of the process that ran it
	IDSlot int    `json:"id_slot"`
	IDBase uint32 `json:"id_base"`
}

// RunJob runs job to completion and removes every trace of it. A job that
// exits non-zero is an error that says so; a cancelled ctx kills it.
func (r *Runtime) RunJob(ctx context.Context, job runtime.Job) (err error) {
	if r.name == "runsc" {
		return fmt.Errorf("template builds run under runc or crun, not %s: %w", r.name, errdefs.ErrInvalidArgument)
	}
	if len(job.Args) == 0 {
		return fmt.Errorf("job: no command: %w", errdefs.ErrInvalidArgument)
	}
	r.sweepJobsOnce.Do(r.sweepJobs)
	res := job.Resources
	if res.CPU <= 0 {
		res.CPU = runtime.DefaultJobResources.CPU
	}
	if res.MemoryMB <= 0 {
		res.MemoryMB = runtime.DefaultJobResources.MemoryMB
	}
	if res.PIDs <= 0 {
		res.PIDs = runtime.DefaultJobResources.PIDs
	}
	id := jobIDPrefix + randomHex(8)
	b := filepath.Join(r.jobsDir(), id)
	if err := os.MkdirAll(r.jobsDir(), 0o711); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if err := os.Mkdir(b, 0o700); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	slot := -1
	defer func() {
		if cerr := r.removeJob(id, b, slot); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	if slot, err = r.ids.claim(b); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	base := r.ids.hostBase(slot)
	if err := writeJSON(filepath.Join(b, "job.json"), jobRecord{Owner: os.Getpid(), IDSlot: slot, IDBase: base}); err != nil {
		return err
	}
	userns, err := r.ids.usernsFor(slot)
	if err != nil {
		return fmt.Errorf("job: %w", err)
	}
	if err := r.shareBundle(b, int(base)); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	rootfs := filepath.Join(b, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	if err := bindMount(job.Root, rootfs, userns, job.ReadOnlyRoot); err != nil {
		return fmt.Errorf("job: %w", err)
	}
	mounts := jobMounts(res)
	for i, bd := range job.Binds {
		src := bd.Source
		opts := []string{"bind", "nosuid", "nodev"}
		if bd.ReadOnly {
			opts = append(opts, "ro")
		}
		if bd.Storage {
			src = filepath.Join(b, "b"+strconv.Itoa(i))
			if err := os.Mkdir(src, 0o755); err != nil {
				return err
			}
			if err := bindMount(bd.Source, src, userns, bd.ReadOnly); err != nil {
				return fmt.Errorf("job: %w", err)
			}
		}
		mounts = append(mounts, specs.Mount{Destination: bd.Dest, Type: "bind", Source: src, Options: opts})
	}
	cwd := job.Cwd
	if cwd == "" {
		cwd = "/"
	}
	memory := res.MemoryMB << 20
	quota := int64(res.CPU * 100000)
	period := uint64(100000)
	pids := res.PIDs
	netns := specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: job.NetNS}
	cfg := &specs.Spec{
		Version:  "1.0.2",
		Hostname: "sbx-build",
		Root:     &specs.Root{Path: rootfs, Readonly: job.ReadOnlyRoot},
		Process: &specs.Process{
			Args: job.Args, Env: job.Env, Cwd: cwd,
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: jobCaps, Effective: jobCaps, Permitted: jobCaps,
			},
			NoNewPrivileges: true,
			Rlimits: []specs.POSIXRlimit{
				{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096},
				{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
			},
		},
		Mounts: mounts,
		Linux: &specs.Linux{
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: r.cfg.UIDRange}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: base, Size: r.cfg.UIDRange}},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.MountNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				netns, {Type: specs.UserNamespace}, {Type: specs.CgroupNamespace},
			},
			CgroupsPath: sandboxCgroup(r.cfg.CgroupParent, id),
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &memory, Swap: &memory},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Seccomp:           seccomp.Build(),
			RootfsPropagation: "private",
			MaskedPaths:       maskedPaths,
			ReadonlyPaths:     readonlyPaths,
		},
	}
	if err := writeJSON(filepath.Join(b, "config.json"), cfg); err != nil {
		return err
	}
	args := append(r.jobGlobal(), "run", "--bundle", b, "--pid-file", filepath.Join(b, "pid"), "--no-new-keyring", id)
	cmd := exec.Command(r.binary, args...)
	cmd.Stdin = job.Stdin
	cmd.Stdout, cmd.Stderr = orDiscard(job.Stdout), orDiscard(job.Stderr)
	// runc run forwards the signals it gets to the container's process, but
	// a job's own children may ignore them: cancellation kills the whole
	// container (every process of its PID namespace) instead.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("job: %s run: %w", r.name, err)
	}
	stop := context.AfterFunc(ctx, func() { r.killJob(b, id) })
	err = cmd.Wait()
	stop()
	if ctx.Err() != nil {
		return fmt.Errorf("job %q: %w", job.Args[0], context.Cause(ctx))
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			return fmt.Errorf("%s exited with status %d", job.Args[0], ee.ExitCode())
		}
		return fmt.Errorf("job %q: %s run: %w", job.Args[0], r.name, err)
	}
	return nil
}

// jobMounts are a job's kernel file systems and /tmp.
func jobMounts(res runtime.Resources) []specs.Mount {
	m := []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
	}
	if res.TmpMB > 0 {
		m = append(m, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(res.TmpMB, 10) + "m"}})
	}
	return m
}

// killJob kills every process of a running job: SIGKILL to its init, the
// PID namespace's, takes the rest with it. The pid file's pid is killed
// only while it is the job's (alive, in the job's cgroup): the job may be
// long gone and its pid another process's.
func (r *Runtime) killJob(bundle, id string) {
	if pid, ok := r.initIn(bundle, id); ok {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = r.runJob(ctx, "kill", id, "KILL")
}

// runJob runs the runtime binary on the jobs' state root.
func (r *Runtime) runJob(ctx context.Context, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, r.binary, append(r.jobGlobal(), args...)...).CombinedOutput()
	return out, err
}

// removeJob removes what a job left: its container, cgroups, mounts,
// bundle and id slot.
func (r *Runtime) removeJob(id, b string, slot int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	if out, err := r.runJob(ctx, "delete", "--force", id); err != nil && !notExist(out) {
		errs = append(errs, fmt.Errorf("job %s: %s delete: %v: %s", id, r.name, err, out))
	}
	if err := removeCgroups(r.cfg.CgroupParent, id); err != nil {
		errs = append(errs, fmt.Errorf("job %s: %w", id, err))
	}
	ents, _ := os.ReadDir(b)
	for _, e := range ents {
		if e.IsDir() {
			if err := unmount(filepath.Join(b, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) == 0 {
		for _, e := range ents {
			if e.IsDir() {
				if sub, err := os.ReadDir(filepath.Join(b, e.Name())); err == nil && len(sub) > 0 {
					errs = append(errs, fmt.Errorf("job %s: %s is not empty after unmounting; leaving the bundle in place", id, e.Name()))
				}
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := os.RemoveAll(b); err != nil {
		return err
	}
	if slot >= 0 {
		return r.ids.release(slot, b)
	}
	return nil
}

// sweepJobs removes the jobs of processes that died running them.
func (r *Runtime) sweepJobs() {
	ents, err := os.ReadDir(r.jobsDir())
	if err != nil {
		return
	}
	for _, e := range ents {
		b := filepath.Join(r.jobsDir(), e.Name())
		var rec jobRecord
		if err := readJSON(filepath.Join(b, "job.json"), &rec); err != nil || rec.Owner <= 0 || processAlive(rec.Owner) {
			continue
		}
		r.killJob(b, e.Name())
		slot := -1
		if rec.IDBase != 0 {
			slot = rec.IDSlot
		}
		if err := r.removeJob(e.Name(), b, slot); err != nil {
			r.log.Warn("removing a job a dead process left", "job", e.Name(), "err", err)
		}
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// jobsState is the per-Runtime state of jobs.
type jobsState struct {
	sweepJobsOnce sync.Once
}

// NewJobRunner returns a function that runs jobs on a runtime made from
// cfg (JobsOnly) at its first call, so that a program that builds no
// template needs no OCI runtime.
func NewJobRunner(cfg Config) func(context.Context, runtime.Job) error {
	cfg.JobsOnly = true
	var (
		once sync.Once
		rt   *Runtime
		err  error
	)
	return func(ctx context.Context, job runtime.Job) error {
		once.Do(func() { rt, err = New(cfg) })
		if err != nil {
			return err
		}
		return rt.RunJob(ctx, job)
	}
}
