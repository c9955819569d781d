package seccomp

import (
	"encoding/binary"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Offsets into struct seccomp_data, which the filter reads:
//
//	struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; };
const (
	offNr        = 0
	offArch      = 4
	offArg0Low32 = 16 // args[0] starts at 16; its low half comes first on little-endian amd64
	offArg1Low32 = 24
)

// x32SyscallBit marks a system call made through the x32 ABI. x32 calls
// arrive with arch AUDIT_ARCH_X86_64, so the arch check alone lets them in.
const x32SyscallBit = 0x40000000

// cloneNamespaceFlags are the clone(2) flags that create a namespace. User
// code must not create namespaces: a new user namespace gives it every
// capability inside, and with that the kernel's whole namespaced attack
// surface. The kernel only reads the low 32 bits of clone's flags, so
// checking them is enough. CLONE_NEWTIME (0x80) cannot really be passed to
// clone, where that byte is the exit signal, but no valid signal has that bit
// set either, so refusing it costs nothing.
const cloneNamespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWTIME

const (
	retAllow       = unix.SECCOMP_RET_ALLOW
	retKillProcess = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM       = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	// clone3 passes its flags in memory that BPF cannot read. ENOSYS, unlike
	// EPERM, makes glibc (2.34+) fall back to clone, whose flags we check.
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// InnerFilter returns the seccomp program that user processes install on
// top of the outer profile, as an array of struct sock_filter in native byte
// order, ready for prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &sock_fprog)
// or Install. It
//
//   - kills the process for any architecture but x86_64 (i386 via int 0x80);
//   - refuses x32 system calls with EPERM (under the outer profile, which
//     knows no x32, they kill the thread first);
//   - refuses every executor_only system call (mount, unshare, setns, ...)
//     with EPERM;
//   - refuses clone with a namespace flag with EPERM;
//   - answers clone3 with ENOSYS, so that libc falls back to clone;
//   - refuses the ioctls that make btrfs subvolumes and snapshots with
//     EPERM (they would escape the workspace's disk quota);
//   - allows everything else, which the outer profile still filters.
//
// It fails only if profile.json names an executor_only call that has no
// amd64 number, which the tests catch.
func InnerFilter() ([]byte, error) {
	nrs, err := syscallNumbers(loaded.ExecutorOnly)
	if err != nil {
		return nil, err
	}

	var a assembler
	innerBody(&a, nrs, cloneNamespaceFlags)
	return a.finish()
}

// innerBody is InnerFilter's program up to finish: executor_only calls
// (nrs) refused, clone3 answered ENOSYS, clone with any flag of
// cloneRefused refused, ioctl sent to finish's btrfs checks.
func innerBody(a *assembler, nrs []uint32, cloneRefused uint32) {
	a.load(offArch)
	a.jumpIf(unix.BPF_JEQ, unix.AUDIT_ARCH_X86_64, "", "kill")
	a.load(offNr)
	a.jumpIf(unix.BPF_JSET, x32SyscallBit, "eperm", "")
	for _, nr := range nrs {
		a.jumpIf(unix.BPF_JEQ, nr, "eperm", "")
	}
	a.jumpIf(unix.BPF_JEQ, unix.SYS_CLONE3, "enosys", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_IOCTL, "ioctl", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_CLONE, "", "allow")
	a.load(offArg0Low32)
	a.jumpIf(unix.BPF_JSET, cloneRefused, "eperm", "allow")
}

// UnprivilegedInnerFilter is the inner filter of the executor's
// unprivileged mode (a Kubernetes Pod), where the outer profile is not
// sbx's profile.json but the node's (containerd's RuntimeDefault), which
// lets ptrace, process_vm_readv/writev, kcmp, io_uring and more through.
// So on top of what InnerFilter does it carries the outer profile's
// allowlist itself:
//
//   - every amd64 system call that profile.json neither allows nor
//     reserves to the executor is refused with EPERM, as are numbers past
//     the last one the table knows (calls newer than this build);
//   - socket only for the families profile.json allows, personality only
//     for its personas;
//   - clone with CLONE_PARENT is refused too: without a PID namespace per
//     execution, a sibling of the execution's first process would be a
//     child of the zygote, out of the tree the executor kills when the
//     run ends (unprivileged.go).
//
// Calls profile.json allows only with argument rules (socket,
// personality, ioctl) are checked here with the same rules.
func UnprivilegedInnerFilter() ([]byte, error) {
	nrs, err := syscallNumbers(loaded.ExecutorOnly)
	if err != nil {
		return nil, err
	}
	allowed, err := syscallNumbers(loaded.Allow)
	if err != nil {
		return nil, err
	}
	known := map[uint32]bool{unix.SYS_SOCKET: true, unix.SYS_PERSONALITY: true, unix.SYS_IOCTL: true}
	for _, nr := range append(allowed, nrs...) {
		known[nr] = true
	}
	var refused []uint32
	var last uint32
	for _, nr := range amd64Syscalls {
		last = max(last, nr)
		if !known[nr] {
			refused = append(refused, nr)
		}
	}
	slices.Sort(refused)
	refused = slices.Compact(refused)

	// The refusals come first, each with a return of its own right after
	// it, so that no jump spans the list (BPF jumps reach 255 ahead).
	var a assembler
	a.load(offArch)
	a.jumpIf(unix.BPF_JEQ, unix.AUDIT_ARCH_X86_64, "arch_ok", "")
	a.ret(retKillProcess)
	a.label("arch_ok")
	a.load(offNr)
	a.jumpIf(unix.BPF_JSET, x32SyscallBit, "", "not_x32")
	a.ret(retEPERM)
	a.label("not_x32")
	a.jumpIf(unix.BPF_JGT, last, "", "known")
	a.ret(retEPERM)
	a.label("known")
	for i, nr := range refused {
		next := fmt.Sprintf("r%d", i)
		a.jumpIf(unix.BPF_JEQ, nr, "", next)
		a.ret(retEPERM)
		a.label(next)
	}
	argRule := func(nr uint32, name string, values []uint64) {
		a.jumpIf(unix.BPF_JEQ, nr, "", name+"_other")
		a.load(offArg0Low32)
		for _, v := range values {
			a.jumpIf(unix.BPF_JEQ, uint32(v), name+"_ok", "")
		}
		a.ret(retEPERM)
		a.label(name + "_ok")
		a.ret(retAllow)
		a.label(name + "_other")
	}
	// socket's and personality's arguments are ints: the kernel reads
	// the low 32 bits only.
	argRule(unix.SYS_SOCKET, "socket", socketFamilies)
	argRule(unix.SYS_PERSONALITY, "personality", personalities)
	innerBody(&a, nrs, cloneNamespaceFlags|unix.CLONE_PARENT)
	return a.finish()
}

// syscallNumbers maps names to sorted, unique amd64 numbers.
func syscallNumbers(names []string) ([]uint32, error) {
	nrs := make([]uint32, 0, len(names))
	for _, name := range names {
		nr, ok := amd64Syscalls[name]
		if !ok {
			return nil, fmt.Errorf("seccomp: %q is not an amd64 system call: %w", name, errdefs.ErrInvalidArgument)
		}
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	return slices.Compact(nrs), nil
}

// assembler builds a classic BPF program with named jump targets, so that
// nobody counts instructions by hand. Jumps go forward only, as BPF requires;
// an empty target means the next instruction.
type assembler struct {
	insns  []unix.SockFilter
	labels map[string]int
	jumps  []pendingJump
}

type pendingJump struct {
	pc     int
	jt, jf string
}

func (a *assembler) load(off uint32) {
	a.insns = append(a.insns, unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: off})
}

func (a *assembler) jumpIf(op uint16, k uint32, jt, jf string) {
	a.jumps = append(a.jumps, pendingJump{pc: len(a.insns), jt: jt, jf: jf})
	a.insns = append(a.insns, unix.SockFilter{Code: unix.BPF_JMP | op | unix.BPF_K, K: k})
}

func (a *assembler) ret(k uint32) {
	a.insns = append(a.insns, unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: k})
}

func (a *assembler) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	a.labels[name] = len(a.insns)
}

// finish ends both filters alike: the "ioctl" label refuses the btrfs
// subvolume and snapshot requests, then the answers every jump names.
func (a *assembler) finish() ([]byte, error) {
	a.label("ioctl")
	a.load(offArg1Low32)
	for _, req := range btrfsCreateIoctls {
		a.jumpIf(unix.BPF_JEQ, req, "eperm", "")
	}
	a.label("allow")
	a.ret(retAllow)
	a.label("eperm")
	a.ret(retEPERM)
	a.label("enosys")
	a.ret(retENOSYS)
	a.label("kill")
	a.ret(retKillProcess)
	return a.assemble()
}

func (a *assembler) assemble() ([]byte, error) {
	if len(a.insns) > unix.BPF_MAXINSNS {
		return nil, fmt.Errorf("seccomp: program has %d instructions, the kernel takes at most %d", len(a.insns), unix.BPF_MAXINSNS)
	}
	offset := func(pc int, target string) (uint8, error) {
		if target == "" {
			return 0, nil
		}
		to, ok := a.labels[target]
		if !ok {
			return 0, fmt.Errorf("seccomp: jump to undefined label %q", target)
		}
		skip := to - pc - 1
		if skip < 0 || skip > 255 {
			return 0, fmt.Errorf("seccomp: jump from %d to %q (%d) out of range", pc, target, to)
		}
		return uint8(skip), nil
	}
	for _, j := range a.jumps {
		var err error
		if a.insns[j.pc].Jt, err = offset(j.pc, j.jt); err != nil {
			return nil, err
		}
		if a.insns[j.pc].Jf, err = offset(j.pc, j.jf); err != nil {
			return nil, err
		}
	}
	out := make([]byte, 0, len(a.insns)*sizeofSockFilter)
	for _, in := range a.insns {
		out = binary.NativeEndian.AppendUint16(out, in.Code)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out, nil
}

// Namespace flags the zygote's filter refuses. The zygote and its workers
// may make mount and PID namespaces (each execution gets its own), and
// nothing else: no network namespace (it would leave the sandbox's
// network-less one for one of its own, with a loopback and netfilter to
// program), no IPC, UTS, cgroup or time namespace, and no user namespace,
// which would give the tenant's code every capability over whatever it
// then creates. clone's flags are read on their low 32 bits by the kernel;
// unshare refuses (EINVAL) any bit it does not know, the upper 32 among
// them, so checking the low half is enough for both.
const (
	zygoteRefusedNamespaces = unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS |
		unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME
	// zygoteSetnsTypes are the namespace types the zygote joins: the
	// user namespace its workers run in, its own PID namespace (to make
	// the next worker's) and, for completeness, a mount namespace. setns
	// with type 0 ("any") is refused, so that the type is checked.
	zygoteSetnsUser = unix.CLONE_NEWUSER
	zygoteSetnsPID  = unix.CLONE_NEWPID
	zygoteSetnsMnt  = unix.CLONE_NEWNS
)

// ZygoteFilter returns the seccomp program the trusted shim installs on
// the Python zygote before it execs it, so that it binds the template's
// code (its interpreter, its sitecustomize, its preload modules) from
// their first instruction, and every worker the zygote forks. On top of
// the outer profile it
//
//   - kills the process for any architecture but x86_64, and refuses x32
//     system calls, as InnerFilter does;
//   - answers clone3 with ENOSYS, so that libc falls back to clone;
//   - refuses clone and unshare with a network, IPC, UTS, cgroup or time
//     namespace flag, and with CLONE_NEWUSER (clone always; unshare
//     unless selfUserns);
//   - refuses setns but into a user, PID or mount namespace;
//   - refuses the btrfs subvolume and snapshot ioctls;
//   - allows everything else, which the outer profile still filters.
//
// selfUserns is for gVisor, which cannot setns into a user namespace: there
// the zygote makes its own (unshare(CLONE_NEWUSER), as uid 1000 without
// capabilities, which any process may) instead of joining the one the shim
// made, so unshare must let that flag through. Those namespaces are the
// sentry's, never the host kernel's.
func ZygoteFilter(selfUserns bool) ([]byte, error) {
	unshareRefused := uint32(zygoteRefusedNamespaces | unix.CLONE_NEWUSER)
	if selfUserns {
		unshareRefused = zygoteRefusedNamespaces
	}
	var a assembler
	a.load(offArch)
	a.jumpIf(unix.BPF_JEQ, unix.AUDIT_ARCH_X86_64, "", "kill")
	a.load(offNr)
	a.jumpIf(unix.BPF_JSET, x32SyscallBit, "eperm", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_CLONE3, "enosys", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_IOCTL, "ioctl", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_SETNS, "setns", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_UNSHARE, "unshare", "")
	a.jumpIf(unix.BPF_JEQ, unix.SYS_CLONE, "", "allow")
	a.load(offArg0Low32)
	a.jumpIf(unix.BPF_JSET, zygoteRefusedNamespaces|unix.CLONE_NEWUSER, "eperm", "allow")
	a.label("unshare")
	a.load(offArg0Low32)
	a.jumpIf(unix.BPF_JSET, unshareRefused, "eperm", "allow")
	a.label("setns")
	a.load(offArg1Low32)
	a.jumpIf(unix.BPF_JEQ, zygoteSetnsUser, "allow", "")
	a.jumpIf(unix.BPF_JEQ, zygoteSetnsPID, "allow", "")
	a.jumpIf(unix.BPF_JEQ, zygoteSetnsMnt, "allow", "eperm")
	return a.finish()
}
