package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestProfileNamesAreAmd64Syscalls(t *testing.T) {
	allow, executorOnly := Names()
	for _, name := range append(append(allow, executorOnly...), conditional...) {
		if _, ok := amd64Syscalls[name]; !ok {
			t.Errorf("%q is not an amd64 system call", name)
		}
	}
	// Fail loudly here rather than in InnerFilter at sandbox start.
	if _, err := syscallNumbers(executorOnly); err != nil {
		t.Errorf("executor_only: %v", err)
	}
	if _, err := syscallNumbers([]string{"vm86"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("syscallNumbers(vm86) = %v, want ErrInvalidArgument", err)
	}
}

func TestSyscallTable(t *testing.T) {
	seen := map[uint32]string{}
	for name, nr := range amd64Syscalls {
		if other, ok := seen[nr]; ok {
			t.Errorf("%q and %q both have number %d", name, other, nr)
		}
		seen[nr] = name
	}
	// Spot checks against the kernel's syscall_64.tbl.
	for name, nr := range map[string]uint32{"read": 0, "clone": 56, "_sysctl": 156, "mount": 165, "unshare": 272, "setns": 308, "clone3": 435} {
		if amd64Syscalls[name] != nr {
			t.Errorf("%s = %d, want %d", name, amd64Syscalls[name], nr)
		}
	}
}

func TestConditionalRuleConstants(t *testing.T) {
	for name, c := range map[string][2]uint64{
		"EPERM":      {eperm, uint64(unix.EPERM)},
		"AF_UNIX":    {afUnix, unix.AF_UNIX},
		"AF_INET":    {afInet, unix.AF_INET},
		"AF_INET6":   {afInet6, unix.AF_INET6},
		"AF_NETLINK": {afNetlink, unix.AF_NETLINK},
	} {
		if c[0] != c[1] {
			t.Errorf("%s = %d, want %d", name, c[0], c[1])
		}
	}
}

// seccompData is the part of struct seccomp_data the filter reads.
type seccompData struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

// run interprets the subset of classic BPF the assembler emits, the way
// the kernel would, so that the filter's logic is checked without
// installing it.
func run(prog []byte, d seccompData) (uint32, error) {
	if len(prog)%sizeofSockFilter != 0 {
		return 0, fmt.Errorf("program is %d bytes", len(prog))
	}
	var buf [64]byte
	binary.LittleEndian.PutUint32(buf[0:], d.nr)
	binary.LittleEndian.PutUint32(buf[4:], d.arch)
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(buf[16+8*i:], a)
	}
	n := len(prog) / sizeofSockFilter
	var acc uint32
	for pc := 0; pc < n; pc++ {
		b := prog[pc*sizeofSockFilter:]
		code, jt, jf, k := binary.LittleEndian.Uint16(b), b[2], b[3], binary.LittleEndian.Uint32(b[4:])
		var taken bool
		switch code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if k%4 != 0 || k+4 > uint32(len(buf)) {
				return 0, fmt.Errorf("pc %d: load from %d", pc, k)
			}
			acc = binary.LittleEndian.Uint32(buf[k:])
			continue
		case unix.BPF_RET | unix.BPF_K:
			return k, nil
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			taken = acc == k
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			taken = acc&k != 0
		default:
			return 0, fmt.Errorf("pc %d: opcode %#x not expected", pc, code)
		}
		if taken {
			pc += int(jt)
		} else {
			pc += int(jf)
		}
	}
	return 0, errors.New("fell off the end of the program")
}

func TestInnerFilterLogic(t *testing.T) {
	prog, err := InnerFilter()
	if err != nil {
		t.Fatal(err)
	}
	const x86 = unix.AUDIT_ARCH_X86_64
	const sigchld = uint64(unix.SIGCHLD) // the exit signal, in clone's low byte
	sys := func(nr uint32, args ...uint64) seccompData {
		d := seccompData{nr: nr, arch: x86}
		copy(d.args[:], args)
		return d
	}
	type tc struct {
		name string
		data seccompData
		want uint32
	}
	cases := []tc{
		{"read", sys(unix.SYS_READ), retAllow},
		{"personality is left to the outer profile", sys(unix.SYS_PERSONALITY, 0x0040000), retAllow},
		{"i386 getpid", seccompData{nr: 20, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"i386 mount", seccompData{nr: 21, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"x32 read", sys(x32SyscallBit | unix.SYS_READ), retEPERM},
		{"x32 mount", sys(x32SyscallBit | unix.SYS_MOUNT), retEPERM},
		{"clone3", sys(unix.SYS_CLONE3), retENOSYS},
		{"fork-like clone", sys(unix.SYS_CLONE, sigchld), retAllow},
		{"vfork-like clone", sys(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|unix.CLONE_PIDFD|sigchld), retAllow},
		{"thread clone", sys(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|
			unix.CLONE_THREAD|unix.CLONE_SYSVSEM|unix.CLONE_SETTLS|unix.CLONE_PARENT_SETTID|unix.CLONE_CHILD_CLEARTID), retAllow},
		// The kernel ignores clone's upper 32 flag bits, so they need no check.
		{"clone with only high bits", sys(unix.SYS_CLONE, 1<<40|sigchld), retAllow},
		{"ioctl TCGETS", sys(unix.SYS_IOCTL, 0, unix.TCGETS), retAllow},
		{"ioctl FICLONE (a reflink copy stays in the quota)", sys(unix.SYS_IOCTL, 3, unix.FICLONE), retAllow},
		{"ioctl btrfs subvolume create", sys(unix.SYS_IOCTL, 3, 0x5000940e), retEPERM},
		{"ioctl btrfs subvolume create v2", sys(unix.SYS_IOCTL, 3, 0x50009418), retEPERM},
		{"ioctl btrfs snapshot create", sys(unix.SYS_IOCTL, 3, 0x50009401), retEPERM},
		{"ioctl btrfs snapshot create v2", sys(unix.SYS_IOCTL, 3, 0x50009417), retEPERM},
		// The kernel reads the request as an unsigned int.
		{"ioctl btrfs subvolume create, high bits set", sys(unix.SYS_IOCTL, 3, 1<<40|0x5000940e), retEPERM},
	}
	_, executorOnly := Names()
	for _, name := range executorOnly {
		cases = append(cases, tc{name, sys(amd64Syscalls[name]), retEPERM})
	}
	for _, f := range namespaceFlags {
		cases = append(cases, tc{"clone " + f.name, sys(unix.SYS_CLONE, uint64(f.flag)|sigchld), retEPERM})
	}
	cases = append(cases, tc{"clone CLONE_NEWTIME", sys(unix.SYS_CLONE, unix.CLONE_NEWTIME|sigchld), retEPERM})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := run(prog, c.data)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("got %#x, want %#x", got, c.want)
			}
		})
	}
}

func TestInstallRejectsMalformedPrograms(t *testing.T) {
	// Each of these fails before anything is installed, so it is safe to
	// run in the test process itself.
	for name, prog := range map[string][]byte{
		"empty":          nil,
		"partial":        make([]byte, 12),
		"too many insns": make([]byte, (unix.BPF_MAXINSNS+1)*sizeofSockFilter),
	} {
		t.Run(name, func(t *testing.T) {
			if err := Install(prog); !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("Install = %v, want ErrInvalidArgument", err)
			}
		})
	}
}

func TestZygoteFilterLogic(t *testing.T) {
	const x86 = unix.AUDIT_ARCH_X86_64
	const sigchld = uint64(unix.SIGCHLD)
	sys := func(nr uint32, args ...uint64) seccompData {
		d := seccompData{nr: nr, arch: x86}
		copy(d.args[:], args)
		return d
	}
	type tc struct {
		name string
		data seccompData
		want uint32
	}
	common := []tc{
		{"read", sys(unix.SYS_READ), retAllow},
		{"mount (workers mount their /proc and views)", sys(unix.SYS_MOUNT), retAllow},
		{"umount2", sys(unix.SYS_UMOUNT2), retAllow},
		{"i386 getpid", seccompData{nr: 20, arch: unix.AUDIT_ARCH_I386}, retKillProcess},
		{"x32 unshare", sys(x32SyscallBit | unix.SYS_UNSHARE), retEPERM},
		{"clone3", sys(unix.SYS_CLONE3), retENOSYS},
		{"fork-like clone", sys(unix.SYS_CLONE, sigchld), retAllow},
		{"clone CLONE_NEWPID|CLONE_NEWNS", sys(unix.SYS_CLONE, unix.CLONE_NEWPID|unix.CLONE_NEWNS|sigchld), retAllow},
		{"clone CLONE_NEWUSER", sys(unix.SYS_CLONE, unix.CLONE_NEWUSER|sigchld), retEPERM},
		{"clone CLONE_NEWNET", sys(unix.SYS_CLONE, unix.CLONE_NEWNET|sigchld), retEPERM},
		{"clone CLONE_NEWNET high bits", sys(unix.SYS_CLONE, 1<<40|unix.CLONE_NEWNET|sigchld), retEPERM},
		{"unshare CLONE_NEWPID", sys(unix.SYS_UNSHARE, unix.CLONE_NEWPID), retAllow},
		{"unshare CLONE_NEWNS", sys(unix.SYS_UNSHARE, unix.CLONE_NEWNS), retAllow},
		{"unshare CLONE_NEWNET", sys(unix.SYS_UNSHARE, unix.CLONE_NEWNET), retEPERM},
		{"unshare CLONE_NEWIPC", sys(unix.SYS_UNSHARE, unix.CLONE_NEWIPC), retEPERM},
		{"unshare CLONE_NEWUTS", sys(unix.SYS_UNSHARE, unix.CLONE_NEWUTS), retEPERM},
		{"unshare CLONE_NEWCGROUP", sys(unix.SYS_UNSHARE, unix.CLONE_NEWCGROUP), retEPERM},
		{"unshare CLONE_NEWTIME", sys(unix.SYS_UNSHARE, unix.CLONE_NEWTIME), retEPERM},
		{"unshare CLONE_NEWNS|CLONE_NEWNET", sys(unix.SYS_UNSHARE, unix.CLONE_NEWNS|unix.CLONE_NEWNET), retEPERM},
		{"setns user", sys(unix.SYS_SETNS, 4, unix.CLONE_NEWUSER), retAllow},
		{"setns pid", sys(unix.SYS_SETNS, 4, unix.CLONE_NEWPID), retAllow},
		{"setns any type", sys(unix.SYS_SETNS, 4, 0), retEPERM},
		{"setns net", sys(unix.SYS_SETNS, 4, unix.CLONE_NEWNET), retEPERM},
		{"setns user|net (pidfd)", sys(unix.SYS_SETNS, 4, unix.CLONE_NEWUSER|unix.CLONE_NEWNET), retEPERM},
		{"ioctl FICLONE", sys(unix.SYS_IOCTL, 3, unix.FICLONE), retAllow},
		{"ioctl btrfs subvolume create", sys(unix.SYS_IOCTL, 3, 0x5000940e), retEPERM},
		{"ioctl btrfs snapshot create v2 high bits", sys(unix.SYS_IOCTL, 3, 1<<40|0x50009417), retEPERM},
	}
	for _, selfUserns := range []bool{false, true} {
		prog, err := ZygoteFilter(selfUserns)
		if err != nil {
			t.Fatal(err)
		}
		want := retEPERM
		if selfUserns {
			want = retAllow
		}
		cases := append(common, tc{"unshare CLONE_NEWUSER", sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER), want},
			tc{"unshare CLONE_NEWUSER|CLONE_NEWNET", sys(unix.SYS_UNSHARE, unix.CLONE_NEWUSER|unix.CLONE_NEWNET), retEPERM})
		for _, c := range cases {
			t.Run(fmt.Sprintf("selfUserns=%v/%s", selfUserns, c.name), func(t *testing.T) {
				got, err := run(prog, c.data)
				if err != nil {
					t.Fatal(err)
				}
				if got != c.want {
					t.Errorf("got %#x, want %#x", got, c.want)
				}
			})
		}
	}
}
