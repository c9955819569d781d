package executor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/seccomp"
)

// The unprivileged mode (Config.Unprivileged) is the executor in a
// Kubernetes Pod on an ordinary node: uid 0 of the node's own user
// namespace with CHOWN, DAC_OVERRIDE, FOWNER, SETUID, SETGID, SETPCAP and
// KILL, no_new_privs, the node's default seccomp profile (no namespaces,
// no mounts), a read-only root and cgroupfs, and the Pod's PID namespace
// with the executor as its init. None of the shim's namespaces can be
// made there, so:
//
//   - the shim makes no mount namespace and no holder: it empties its
//     bounding set but for CAP_SETGID, and its inheritable and ambient
//     sets (CAP_SETPCAP), installs the inner filter
//     (seccomp.UnprivilegedInnerFilter, which carries sbx's outer
//     allowlist, the node's profile being laxer) and forks python as
//     uid/gid 1000 with no groups, no_new_privs and CAP_SETGID alone. The
//     zygote keeps that one permitted but never effective, out of the
//     ambient and inheritable sets (worker.py's setgid_idle), for one use:
//     a worker of a conversation takes that conversation's group at its
//     drop (podviews.go), and then empties every set. A process that holds
//     a capability is out of reach of the /proc files and ptrace of the
//     uid-1000 processes beside it.
//   - The control directory stays root's, mode 0700; the zygote gets its
//     scripts and the filter as sealed memfds (read as /proc/self/fd/N),
//     so that nothing of the control directory (the socket, the
//     executor's files) is ever reachable by uid 1000.
//   - A worker is a plain child of the zygote in the sandbox's PID and
//     mount namespaces. It calls setsid and makes itself a child
//     subreaper, so that what the run starts, daemons that double-fork
//     included, stays in its process tree while it lives; clone with
//     CLONE_PARENT, which would put a process beside it, is refused by the
//     inner filter. When it dies, whatever is left of its tree is
//     reparented to the executor (init of the PID namespace, or a
//     subreaper), and the executor kills it (sweepOrphans): a process
//     whose parent is the executor and which the executor did not start
//     itself (its shims) belongs to no live execution. Stateless runs are
//     swept before their result is returned; the ends of contexts and of
//     the zygote are swept as they are reported.
//
// docs/SECURITY.md ("In a Pod") says what is lost against runc.

// shimUnprivileged is the shim of the unprivileged mode (see above).
func shimUnprivileged(cfg shimConfig, status *os.File) (unix.WaitStatus, error) {
	zcfg := cfg.Zygote
	zcfg.Userns, zcfg.UsernsFD = "", 0
	zcfg.ProcOvermounts = nil
	zcfg.Files = map[string]string{}
	files := []uintptr{0, 1, 2, 3}
	var filter []byte
	script := ""
	for _, name := range cfg.Copy {
		b, err := os.ReadFile(filepath.Join(cfg.ControlDir, name))
		if err != nil {
			return 0, err
		}
		fd, err := sealedMemfd(name, b)
		if err != nil {
			return 0, err
		}
		defer unix.Close(fd)
		path := "/proc/self/fd/" + strconv.Itoa(len(files))
		files = append(files, uintptr(fd))
		zcfg.Files[name] = path
		switch {
		case name == filepath.Base(cfg.Script):
			script = path
		case zcfg.SeccompFile != "" && name == filepath.Base(zcfg.SeccompFile):
			zcfg.SeccompFile = path
			filter = b
		}
	}
	if script == "" {
		return 0, fmt.Errorf("the zygote script %s is not among the files to hand over", cfg.Script)
	}
	// CAP_SETGID alone stays, for the zygote to hand each worker its
	// conversation's group (podviews.go): through the exec as an ambient
	// capability, which gVisor does not have. There the zygote gets none,
	// and a run naming a conversation fails (worker.py's enter_run).
	keep, ambient := uint64(1<<unix.CAP_SETGID), []uintptr{unix.CAP_SETGID}
	if _, err := unix.PrctlRetInt(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_IS_SET, unix.CAP_SETGID, 0, 0); err != nil {
		keep, ambient = 0, nil
	}
	if err := dropInheritable(keep); err != nil {
		return 0, fmt.Errorf("%w (the unprivileged mode needs CAP_SETPCAP to empty the bounding set)", err)
	}
	// The zygote needs no namespace: it gets the workers' filter, which
	// binds the template's code as it binds user code.
	if len(filter) == 0 {
		var err error
		if filter, err = seccomp.ZygoteFilter(false); err != nil {
			return 0, err
		}
	}
	if err := seccomp.Install(filter); err != nil {
		return 0, fmt.Errorf("zygote filter: %w", err)
	}
	pid, err := forkZygote(cfg.Python, script, zcfg, files, true, ambient...)
	if err != nil {
		return 0, err
	}
	return waitZygote(pid, shimStatus{SharedPIDNS: true}, status)
}

// sealedMemfd is a memfd holding b that nobody can change any more.
func sealedMemfd(name string, b []byte) (int, error) {
	fd, err := unix.MemfdCreate("sbx-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	for off := 0; off < len(b); {
		n, err := unix.Write(fd, b[off:])
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("write memfd: %w", err)
		}
		off += n
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("seal memfd: %w", err)
	}
	return fd, nil
}

// maxSweepRounds bounds one sweep: each round kills every stray tree it
// finds; a process forked by a stray after the scan is found by the next
// round, once its parent is dead. The pids limit bounds how many there
// can be; a sweep that gives up is started again by the next end.
const maxSweepRounds = 64

// sweepOrphans kills every process whose parent is this process but which
// it did not start itself, with all its descendants (see the top of the
// file). It runs in the unprivileged mode only: under runc each
// execution's PID namespace does this.
func (s *Server) sweepOrphans() {
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	self := os.Getpid()
	for range maxSweepRounds {
		procs, err := scanProcs()
		if err != nil {
			s.log.Warn("sweep: cannot list processes", "err", err)
			return
		}
		children := map[int][]int{}
		var strays []int
		for pid, p := range procs {
			children[p.ppid] = append(children[p.ppid], pid)
			if p.ppid == self && p.state != 'Z' && !s.rp.started(pid) {
				strays = append(strays, pid)
			}
		}
		if len(strays) == 0 {
			return
		}
		var doomed []int
		for len(strays) > 0 {
			pid := strays[len(strays)-1]
			strays = strays[:len(strays)-1]
			doomed = append(doomed, pid)
			strays = append(strays, children[pid]...)
		}
		slices.Sort(doomed)
		for _, pid := range slices.Compact(doomed) {
			if procs[pid].state == 'Z' {
				continue
			}
			s.killIfParent(pid, procs[pid].ppid)
		}
	}
	s.log.Warn("sweep: processes of ended executions still appear; the next end sweeps again")
}

// killIfParent sends SIGKILL to pid if, pinned by a pidfd, it still has
// ppid for its parent, or is now ours (its parent died since the scan) and
// not one we started: a pid reused meanwhile (by a new worker, say) is
// not hit.
func (s *Server) killIfParent(pid, ppid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	p, err := readProcStat(pid)
	if err != nil {
		return
	}
	if p.ppid != ppid && (p.ppid != os.Getpid() || s.rp.started(pid)) {
		return
	}
	_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

type procStat struct {
	ppid  int
	state byte
}

// scanProcs reads the parent and state of every process in /proc.
func scanProcs() (map[int]procStat, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := make(map[int]procStat, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := readProcStat(pid); err == nil {
			out[pid] = p
		}
	}
	return out, nil
}

// readProcStat parses /proc/PID/stat. The command name, in parentheses,
// is the process's to choose: the fields after its last ')' are not.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, errors.New("malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return procStat{}, errors.New("malformed stat")
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, err
	}
	return procStat{ppid: ppid, state: f[0][0]}, nil
}

// kickSweep asks the sweeper for a sweep without waiting for it.
func (s *Server) kickSweep() {
	select {
	case s.sweepKick <- struct{}{}:
	default:
	}
}

// sweeper sweeps when kicked, until the server shuts down.
func (s *Server) sweeper() {
	defer s.wg.Done()
	for {
		select {
		case <-s.sweepKick:
			s.sweepOrphans()
		case <-s.baseCtx.Done():
			return
		}
	}
}
