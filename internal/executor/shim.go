package executor

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/mountinfo"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
)

// The zygote is the template's Python: its interpreter, libc, ld.so,
// sitecustomize and preload modules all come from the template's rootfs,
// which the tenant wrote. So it never runs with a capability in the
// sandbox's user namespace. What needs capabilities to set it up comes from
// sbx itself: this binary, re-executed in a hidden mode (the "shim"), does
// it and then starts the zygote as the sandbox user with nothing.
//
// On Linux the shim, still the sandbox's root:
//
//  1. takes a mount namespace of its own (unshare on its locked thread),
//     makes it private and removes the runtime's overmounts under /proc
//     there, recording them: a worker in a less privileged user namespace
//     may mount a /proc of its own only if no locked mount hides part of
//     the existing one (the kernel's mount_too_revealing), so the workers
//     put the same masks back on their own /proc instead;
//  2. covers the control directory there with a small read-only tmpfs
//     holding copies of the scripts and the inner filter: the zygote and
//     its workers never see the executor's socket or anything else of the
//     real control directory;
//  3. on a second locked thread whose uids are the sandbox user's (the
//     saved uid stays 0, so its capabilities are only set aside; the
//     thread ends with its goroutine), starts
//     the "holder" with CLONE_NEWUSER|CLONE_NEWPID and the single mapping
//     uid 1000 -> 1000, gid 1000 -> 1000 (setgroups denied). That makes a
//     user namespace U_x owned by uid 1000, and a PID namespace N_z owned
//     by U_x whose init is the holder (this binary again, which only waits
//     for its stdin to close). Nothing but uid 1000 is mapped in U_x, so
//     what the shim's files and the executor's socket are owned by means
//     nothing there. The same thread opens the holder's user and PID
//     namespaces, which the owner of U_x may;
//  4. joins N_z for its children (setns; the kernel refuses a PID namespace
//     that has no init yet, hence the holder as init), empties its bounding
//     and inheritable sets, installs the zygote filter
//     (seccomp.ZygoteFilter), and forks python as uid/gid 1000 with no
//     groups and no_new_privs, handing it the descriptor of U_x.
//
// The zygote, in the sandbox's user namespace with no capability at all,
// imports its preload list, then joins U_x (setns is allowed to the owner
// of a child user namespace) and from there has every capability over U_x's
// namespaces and nothing else: it may setns its own PID namespace N_z back
// for its children and unshare a fresh one per worker, and mount in the
// mount namespaces its workers make; files owned by anyone but uid 1000
// are as foreign to it as to any uid 1000 process.
//
// gVisor (runsc) has no setns for user namespaces nor a pid_for_children;
// its namespace files are not nsfs. There the shim makes no holder, and the
// zygote makes U_x itself after its preload (unshare(CLONE_NEWUSER) as uid
// 1000 without capabilities, which any process may), so the zygote filter
// lets unshare take CLONE_NEWUSER there; the zygote stays in the sandbox's
// PID namespace, which gVisor lets it unshare a new one from repeatedly.

// Hidden modes of the executor binary (os.Args[1]).
const (
	shimMode   = "sbx-zygote-shim"
	holderMode = "sbx-zygote-holder"
)

// init keeps the shim's main goroutine on the process's main thread for
// good. The shim turns other threads into the sandbox user's (the
// holder's, startHolder) and lets them end with their goroutines; the main
// thread cannot end, and a goroutine that ran there would leave it, the
// thread /proc/PID/status reports, with uid 1000 and capabilities set
// aside for the process's life. Locked in init, main runs there and no
// other goroutine can.
func init() {
	if len(os.Args) > 1 && os.Args[1] == shimMode {
		runtime.LockOSThread()
	}
}

// RunHelper runs the hidden helper mode that os.Args names and exits; it
// returns at once when the process is not one of the executor's helpers.
// Call it first in main, and in TestMain of tests that run a Server
// in-process: the executor starts its helpers by re-executing itself.
func RunHelper() {
	if len(os.Args) < 2 || (os.Args[1] != shimMode && os.Args[1] != holderMode) {
		return
	}
	// Each thread of a helper is a task in the sandbox's pids cgroup, and
	// they have nothing to do in parallel.
	runtime.GOMAXPROCS(1)
	switch os.Args[1] {
	case shimMode:
		os.Exit(shimMain(os.Args[2:]))
	case holderMode:
		holderMain()
		os.Exit(0)
	}
}

// holderMain is the init of the zygote's PID namespace: it waits for its
// stdin, a pipe from the shim, to close. When it exits the kernel kills
// every process left in that namespace (the zygote and its workers).
//
// It runs as uid 1000, so each of its threads counts against the
// sandbox's RLIMIT_NPROC, and a Go program that cannot make a thread it
// wants dies (with it the zygote). So it waits in a raw read, which the
// scheduler takes for running code: no thread is handed its processor, and
// none is made; a preemption signal interrupts the read, and the loop
// yields before it reads again.
func holderMain() {
	var buf [64]byte
	for {
		n, _, errno := unix.RawSyscall(unix.SYS_READ, 0, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
		switch {
		case errno == unix.EINTR:
			runtime.Gosched()
		case errno != 0 || n == 0:
			return
		}
	}
}

// shimConfig is the shim's argument.
type shimConfig struct {
	Python     string       `json:"python"`
	Script     string       `json:"script"`      // zygote.py, in ControlDir
	ControlDir string       `json:"control_dir"` // covered by the zygote's copy
	Copy       []string     `json:"copy"`        // names in ControlDir the zygote reads
	Zygote     zygoteConfig `json:"zygote"`      // completed by the shim
}

// shimStatus is what the shim reports on its status pipe (fd 4) once the
// zygote runs, so that the executor need not trust the zygote about it.
type shimStatus struct {
	// SharedPIDNS: the zygote and its workers are in the executor's PID
	// namespace, so their pids are the executor's too.
	SharedPIDNS bool   `json:"shared_pid_ns"`
	Userns      string `json:"userns"`
	// Error says why the shim could not start the zygote.
	Error string `json:"error,omitempty"`
}

// procOvermount is a mount the runtime put under /proc, which each worker
// puts back on its own /proc.
type procOvermount struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"readonly"` // a read-only bind of itself, else a mask
}

// nsfsMagic is NSFS_MAGIC: namespace files on a kernel that can setns them.
const nsfsMagic = 0x6e736673

func shimMain(args []string) int {
	// Namespaces, credentials and the bounding set are per thread: every
	// step below and the fork of the zygote run on this one.
	runtime.LockOSThread()
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "sbx-executor zygote shim: want one argument")
		return 2
	}
	var cfg shimConfig
	if err := json.Unmarshal([]byte(args[0]), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-executor zygote shim:", err)
		return 2
	}
	// Not the zygote's to inherit.
	unix.CloseOnExec(4)
	status := os.NewFile(4, "shim-status")
	ws, err := func() (unix.WaitStatus, error) {
		if err := dropFileCaps(); err != nil {
			return 0, err
		}
		return shim(cfg, status)
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbx-executor zygote shim:", err)
		b, _ := json.Marshal(shimStatus{Error: err.Error()})
		_, _ = status.Write(append(b, '\n'))
		return 70
	}
	// The zygote's end is ours: mirror it, so that the executor sees how
	// its zygote died.
	if ws.Signaled() {
		signal.Reset(ws.Signal())
		_ = unix.Kill(os.Getpid(), ws.Signal())
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// shim sets up, starts the zygote and waits for it.
func shim(cfg shimConfig, status *os.File) (unix.WaitStatus, error) {
	if cfg.Zygote.Unprivileged {
		return shimUnprivileged(cfg, status)
	}
	uid, gid := cfg.Zygote.UID, cfg.Zygote.GID
	var st unix.Statfs_t
	nsfs := unix.Statfs("/proc/self/ns/user", &st) == nil && st.Type == nsfsMagic
	// The holder starts on a thread of its own (startHolder) while this
	// one makes the mount namespace: they do not depend on each other.
	var holderc <-chan holderResult
	if nsfs {
		holderc = startHolder(uid, gid)
	}
	overmounts, err := zygoteMounts(cfg)
	var holder *holderProc
	if holderc != nil {
		r := <-holderc
		if r.h != nil {
			holder = r.h
			defer holder.stop()
		}
		if err == nil {
			err = r.err
		}
	}
	if err != nil {
		return 0, err
	}
	zcfg := cfg.Zygote
	zcfg.ProcOvermounts = overmounts
	files := []uintptr{0, 1, 2, 3}
	selfUserns := !nsfs
	if nsfs {
		// Our children are born in N_z; the holder is its init.
		if err := unix.Setns(holder.pidns, unix.CLONE_NEWPID); err != nil {
			return 0, fmt.Errorf("setns(the zygote's PID namespace): %w", err)
		}
		zcfg.Userns, zcfg.UsernsFD = "join", 4
		files = append(files, uintptr(holder.userns))
	} else {
		zcfg.Userns = "self"
	}

	if err := dropInheritable(0); err != nil {
		return 0, err
	}
	filter, err := seccomp.ZygoteFilter(selfUserns)
	if err != nil {
		return 0, err
	}
	if err := seccomp.Install(filter); err != nil {
		return 0, fmt.Errorf("zygote filter: %w", err)
	}
	pid, err := forkZygote(cfg.Python, cfg.Script, zcfg, files, holder == nil)
	if err != nil {
		return 0, err
	}
	if holder != nil {
		unix.Close(holder.userns)
		unix.Close(holder.pidns)
	}
	return waitZygote(pid, shimStatus{SharedPIDNS: holder == nil, Userns: zcfg.Userns}, status)
}

// forkZygote starts python on script as the sandbox user with no groups,
// handing it files. pdeathsig: the zygote dies with this thread.
func forkZygote(python, script string, zcfg zygoteConfig, files []uintptr, pdeathsig bool, ambient ...uintptr) (int, error) {
	cfgJSON, err := json.Marshal(zcfg)
	if err != nil {
		return 0, err
	}
	sys := &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: uint32(zcfg.UID), Gid: uint32(zcfg.GID), Groups: []uint32{}},
		AmbientCaps: ambient,
	}
	if pdeathsig {
		// This thread lives as long as the shim. (In N_z the holder's end
		// does it: Go's Pdeathsig check cannot see a parent in another PID
		// namespace and would kill the child at once.)
		sys.Pdeathsig = syscall.SIGKILL
	}
	pid, err := syscall.ForkExec(python, []string{python, "-I", script, string(cfgJSON)}, &syscall.ProcAttr{
		Dir:   "/",
		Env:   os.Environ(),
		Files: files,
		Sys:   sys,
	})
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", python, err)
	}
	return pid, nil
}

// waitZygote reports st on the status pipe and waits for the zygote pid,
// killing it on SIGTERM.
func waitZygote(pid int, st shimStatus, status *os.File) (unix.WaitStatus, error) {
	// The executor stops the zygote by stopping us (SIGTERM, or SIGKILL,
	// which Pdeathsig passes on). The pid stays the zygote's until we reap
	// it, which waits for the lock.
	var mu sync.Mutex
	reaped := false
	term := make(chan os.Signal, 1)
	signal.Notify(term, unix.SIGTERM, unix.SIGINT)
	go func() {
		<-term
		mu.Lock()
		if !reaped {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		mu.Unlock()
	}()
	b, _ := json.Marshal(st)
	_, _ = status.Write(append(b, '\n'))
	status.Close()
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("wait for the zygote: %w", err)
		}
		break
	}
	mu.Lock()
	defer mu.Unlock()
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, unix.EINTR) {
			reaped = true
			if err != nil {
				return 0, fmt.Errorf("wait for the zygote: %w", err)
			}
			return ws, nil
		}
	}
}

// holderProc is the init of the zygote's PID namespace and the creator of
// its user namespace, with descriptors of both.
type holderProc struct {
	pid           int
	stdin         *os.File // closing it ends the holder
	userns, pidns int
}

func (h *holderProc) stop() {
	h.stdin.Close()
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(h.pid, &ws, 0, nil); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// zygoteMounts makes this thread's mount namespace the zygote's (see the
// top of the file) and returns the /proc overmounts it removed.
func zygoteMounts(cfg shimConfig) ([]procOvermount, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("unshare(CLONE_NEWNS): %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("make mounts private: %w", err)
	}
	overmounts, err := removeProcOvermounts()
	if err != nil {
		return nil, err
	}
	if err := coverControlDir(cfg.ControlDir, cfg.Copy); err != nil {
		return nil, err
	}
	return overmounts, nil
}

type holderResult struct {
	h   *holderProc
	err error
}

// startHolder starts the holder from a thread of its own whose uids and
// gids are the sandbox user's (see the top of the file). The thread never
// goes back: it ends with its goroutine, locked, so nothing else runs on
// it. (Being another thread than the shim's main one, it is also still in
// the sandbox's mount namespace.) The holder ends when its stdin closes,
// which the shim's death does too (no Pdeathsig: Go's check of it cannot
// see a parent in another PID namespace and would kill the child at once).
func startHolder(uid, gid int) <-chan holderResult {
	done := make(chan holderResult, 1)
	go func() {
		runtime.LockOSThread()
		h, err := startHolderOnThread(uid, gid)
		done <- holderResult{h, err}
	}()
	return done
}

func startHolderOnThread(uid, gid int) (*holderProc, error) {
	// Raw system calls: syscall.Setresuid and friends change every thread
	// of the process.
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return nil, fmt.Errorf("setgroups: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), 0); e != 0 {
		return nil, fmt.Errorf("setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), 0); e != 0 {
		return nil, fmt.Errorf("setresuid: %w", e)
	}
	// Changing the effective uid made the process undumpable, which makes
	// the holder's /proc files (its uid_map, written below) root's until
	// it execs. Dumpable again for that, and undumpable once it is done.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("PR_SET_DUMPABLE: %w", err)
	}
	defer unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0) //nolint:errcheck
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	pid, err := syscall.ForkExec("/proc/self/exe", []string{selfPath(), holderMode}, &syscall.ProcAttr{
		Dir: "/",
		// One processor from the runtime's start: with more it makes
		// threads while it starts (see holderMain).
		Env:   []string{"GOMAXPROCS=1"},
		Files: []uintptr{r.Fd(), devNullFd(), 2},
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWPID,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		},
	})
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("start the namespace holder: %w", err)
	}
	h := &holderProc{pid: pid, stdin: w, userns: -1, pidns: -1}
	if h.userns, err = unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
		h.pidns, err = unix.Open(fmt.Sprintf("/proc/%d/ns/pid", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		if h.userns >= 0 {
			unix.Close(h.userns)
		}
		h.stop()
		return nil, fmt.Errorf("open the holder's namespaces: %w", err)
	}
	return h, nil
}

var devNull *os.File

func devNullFd() uintptr {
	if devNull == nil {
		devNull, _ = os.Open(os.DevNull)
	}
	return devNull.Fd()
}

// selfPath names this binary in argv[0] (it is executed as /proc/self/exe).
func selfPath() string {
	if p, err := os.Executable(); err == nil {
		return p
	}
	return "sbx-executor"
}

// removeProcOvermounts unmounts, in this mount namespace, what is mounted
// below /proc, deepest first, and returns it (see the top of the file).
func removeProcOvermounts() ([]procOvermount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []procOvermount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		point := mountinfo.Unescape(fields[4])
		if !strings.HasPrefix(point, "/proc/") {
			continue
		}
		out = append(out, procOvermount{Path: point, ReadOnly: fields[sep+1] == "proc"})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	order := slices.Clone(out)
	slices.SortStableFunc(order, func(a, b procOvermount) int { return len(b.Path) - len(a.Path) })
	for _, m := range order {
		if err := unix.Unmount(m.Path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("unmount %s: %w", m.Path, err)
		}
	}
	return out, nil
}

// coverControlDir mounts, in this mount namespace, a small read-only tmpfs
// over dir holding copies of the named files (readable by all: they are
// sbx's scripts and the inner filter, no secret) and an empty "view"
// directory, where workers assemble conversation views.
func coverControlDir(dir string, names []string) error {
	data := make(map[string][]byte, len(names))
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		data[n] = b
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	err := unix.Mount("tmpfs", dir, "tmpfs", flags, "mode=0755,size=4m,nr_inodes=64")
	if errors.Is(err, unix.EINVAL) {
		// gVisor's tmpfs has no nr_inodes (the sentry bounds it anyway).
		err = unix.Mount("tmpfs", dir, "tmpfs", flags, "mode=0755,size=4m")
	}
	if err != nil {
		return fmt.Errorf("cover the control directory: %w", err)
	}
	for n, b := range data {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o444); err != nil {
			return err
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "view"), 0o755); err != nil {
		return err
	}
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("make the zygote's control directory read-only: %w", err)
	}
	return nil
}

// dropInheritable empties this thread's bounding, inheritable and ambient
// sets, which the zygote would inherit; setuid to the sandbox user in the
// child clears the rest.
func dropInheritable(keep uint64) error {
	last := 63
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("PR_CAPBSET_DROP %d: %w", c, err)
		}
	}
	// gVisor has no ambient set.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("PR_CAP_AMBIENT_CLEAR_ALL: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// dropFileCaps gives up, in every thread, the capabilities the executor
// holds for its file routes alone (fileCaps): the shim writes no file of
// the workspace.
func dropFileCaps() error {
	for c := 0; c < 32; c++ {
		if fileCaps&(1<<c) == 0 {
			continue
		}
		_, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0)
		if e == syscall.ENOTSUP {
			return nil // a test binary built with cgo (-race): the host's root anyway
		}
		if e != 0 && e != unix.EINVAL {
			return fmt.Errorf("PR_CAPBSET_DROP %d: %w", c, e)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Effective &^= fileCaps
	data[0].Permitted &^= fileCaps
	data[0].Inheritable &^= fileCaps
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}
