package seccomp

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// mustDeny are the system calls no process in a sandbox may make, so they
// must be in neither list. The reasons, briefly: ptrace, process_vm_*,
// kcmp and pidfd_getfd reach into other processes; bpf, perf_event_open,
// io_uring_*, userfaultfd, the key calls and the new mount API have long
// histories of kernel exploits; the rest change host-wide state (time,
// modules, swap, reboot, accounting, quotas, hostname, kernel log), bypass
// path checks (*_by_handle_at), escape the root (chroot, pivot_root), run
// legacy code (uselib, vm86, modify_ldt, _sysctl, ustat, sysfs) or move
// memory between NUMA nodes of other processes.
var mustDeny = []string{
	"_sysctl", "acct", "add_key", "adjtimex", "bpf", "chroot", "clock_adjtime",
	"clock_settime", "create_module", "delete_module", "fanotify_init",
	"fanotify_mark", "finit_module", "fsconfig", "fsmount", "fsopen", "fspick",
	"get_kernel_syms", "init_module", "io_uring_enter", "io_uring_register",
	"io_uring_setup", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load",
	"keyctl", "listmount", "listns", "lookup_dcookie", "migrate_pages",
	"modify_ldt", "mount_setattr", "move_mount", "move_pages",
	"name_to_handle_at", "nfsservctl", "open_by_handle_at", "open_tree",
	"open_tree_attr", "perf_event_open", "pidfd_getfd", "pivot_root",
	"process_madvise", "process_vm_readv", "process_vm_writev", "ptrace",
	"query_module", "quotactl", "quotactl_fd", "reboot", "request_key",
	"setdomainname", "sethostname", "settimeofday", "statmount", "swapoff",
	"swapon", "syslog", "sysfs", "uselib", "userfaultfd", "ustat", "vhangup",
	"vm86", "vm86old",
}

// conditional are allowed only through argument rules (conditionalRules, ioctlRules);
// an unconditional entry in either list would override those rules.
var conditional = []string{"ioctl", "personality", "socket"}

func TestProfileLists(t *testing.T) {
	p, err := parseProfile(profileJSON)
	if err != nil {
		t.Fatal(err)
	}
	lists := map[string][]string{"allow": p.Allow, "executor_only": p.ExecutorOnly}
	for name, list := range lists {
		if len(list) == 0 {
			t.Errorf("%s is empty", name)
		}
		// Sorted and unique keeps review diffs readable.
		if !slices.IsSorted(list) {
			t.Errorf("%s is not sorted", name)
		}
		if len(slices.Compact(slices.Clone(list))) != len(list) {
			t.Errorf("%s has duplicates", name)
		}
		for _, sc := range list {
			if slices.Contains(mustDeny, sc) {
				t.Errorf("%s contains %q, which must be denied everywhere", name, sc)
			}
			if slices.Contains(conditional, sc) {
				t.Errorf("%s contains %q, which is allowed only with argument rules", name, sc)
			}
		}
	}
	for _, sc := range p.ExecutorOnly {
		if slices.Contains(p.Allow, sc) {
			t.Errorf("%q is in both allow and executor_only", sc)
		}
	}
	// The inner filter must be able to tell these apart, so they must
	// reach user code through the outer profile's plain allow list.
	for _, sc := range []string{"clone", "clone3", "execve", "exit_group", "seccomp", "prctl"} {
		if !slices.Contains(p.Allow, sc) {
			t.Errorf("allow lacks %q", sc)
		}
	}
	for _, sc := range []string{"mount", "umount2", "unshare", "setns"} {
		if !slices.Contains(p.ExecutorOnly, sc) {
			t.Errorf("executor_only lacks %q", sc)
		}
	}
	t.Logf("allow: %d system calls, executor_only: %d, conditional: %d", len(p.Allow), len(p.ExecutorOnly), len(conditional))
}

func TestParseProfileRejectsBadData(t *testing.T) {
	for name, data := range map[string]string{
		"not json":    `{`,
		"unknown key": `{"allow": ["read"], "executor-only": ["mount"]}`,
		"empty allow": `{"allow": [], "executor_only": ["mount"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := parseProfile([]byte(data)); err == nil {
				t.Error("parseProfile accepted it")
			}
		})
	}
}

func TestNamesReturnsCopies(t *testing.T) {
	allow, executorOnly := Names()
	allow[0], executorOnly[0] = "ptrace", "ptrace"
	again, againExec := Names()
	if again[0] == "ptrace" || againExec[0] == "ptrace" {
		t.Fatal("Names exposes the package's lists")
	}
}

func TestOCI(t *testing.T) {
	s := OCI()
	if s.DefaultAction != specs.ActErrno {
		t.Errorf("defaultAction = %s, want %s", s.DefaultAction, specs.ActErrno)
	}
	if s.DefaultErrnoRet == nil || *s.DefaultErrnoRet != 1 {
		t.Errorf("defaultErrnoRet = %v, want 1 (EPERM)", s.DefaultErrnoRet)
	}
	if !slices.Equal(s.Architectures, []specs.Arch{specs.ArchX86_64}) {
		t.Errorf("architectures = %v, want only %s", s.Architectures, specs.ArchX86_64)
	}

	allowed := map[string]bool{}   // unconditionally
	ruled := map[string][]uint64{} // name -> arg0 values of its rules
	var ioctls []specs.LinuxSyscall
	for _, sc := range s.Syscalls {
		if slices.Equal(sc.Names, []string{"ioctl"}) {
			ioctls = append(ioctls, sc) // checked by TestIoctlRules
			continue
		}
		if sc.Action != specs.ActAllow {
			t.Errorf("rule for %v has action %s; the profile should only allow", sc.Names, sc.Action)
		}
		for _, name := range sc.Names {
			if len(sc.Args) == 0 {
				allowed[name] = true
				continue
			}
			for _, arg := range sc.Args {
				if arg.Index != 0 {
					t.Errorf("%s: rule on argument %d, want 0", name, arg.Index)
				}
				v := arg.Value
				if arg.Op == specs.OpMaskedEqual {
					v = arg.ValueTwo
				}
				ruled[name] = append(ruled[name], v)
			}
		}
	}
	allow, executorOnly := Names()
	for _, name := range append(allow, executorOnly...) {
		if !allowed[name] {
			t.Errorf("%q from profile.json is not allowed", name)
		}
	}
	if len(allowed) != len(allow)+len(executorOnly) {
		t.Errorf("%d names allowed unconditionally, profile.json has %d", len(allowed), len(allow)+len(executorOnly))
	}
	for _, name := range mustDeny {
		if allowed[name] || ruled[name] != nil {
			t.Errorf("%q is allowed", name)
		}
	}
	if got, want := ruled["personality"], []uint64{0, 0x8, 0x20000, 0x20008, 0xffffffff}; !slices.Equal(got, want) {
		t.Errorf("personality allowed for %#x, want %#x", got, want)
	}
	if got := ruled["socket"]; slices.Contains(got, 40) || !slices.Contains(got, afUnix) {
		t.Errorf("socket allowed for families %v; want AF_UNIX and never AF_VSOCK (40)", got)
	}

	if len(ioctls) == 0 {
		t.Error("no rule allows ioctl")
	}

	// Callers may change what they get.
	s.Syscalls[0].Names[0] = "ptrace"
	if OCI().Syscalls[0].Names[0] == "ptrace" {
		t.Error("OCI shares its slices between calls")
	}
}

func TestMustParsePanics(t *testing.T) {
	// A bad profile.json must stop the binary at start-up rather than
	// yield an empty allowlist.
	defer func() {
		if recover() == nil {
			t.Error("mustParse did not panic on bad data")
		}
	}()
	mustParse([]byte(`{"allow": 1}`))
}

// TestIoctlRules evaluates the ioctl rules the way the kernel's filter
// will (libseccomp ORs them): every request is allowed but the btrfs
// subvolume and snapshot ones, also when a high bit is set to dodge a
// comparison, while a negative int's sign extension passes.
func TestIoctlRules(t *testing.T) {
	var rules []specs.LinuxSyscall
	for _, sc := range OCI().Syscalls {
		if slices.Contains(sc.Names, "ioctl") {
			if len(sc.Names) != 1 || sc.Action != specs.ActAllow || len(sc.Args) != 1 || sc.Args[0].Index != 1 {
				t.Fatalf("ioctl rule %+v: want allow rules with one comparison of the request each", sc)
			}
			rules = append(rules, sc)
		}
	}
	allowed := func(req uint64) bool {
		for _, r := range rules {
			a := r.Args[0]
			switch a.Op {
			case specs.OpMaskedEqual:
				if req&a.Value == a.ValueTwo {
					return true
				}
			case specs.OpGreaterEqual:
				if req >= a.Value {
					return true
				}
			default:
				t.Fatalf("ioctl rule with op %s", a.Op)
			}
		}
		return false
	}
	refused := []uint64{0x50009401, 0x5000940e, 0x50009417, 0x50009418,
		1<<32 | 0x5000940e, 0xffff0000_50009418, 1<<63 | 0x50009401, 0x7fffffff_50009417}
	for _, req := range refused {
		if allowed(req) {
			t.Errorf("ioctl request %#x is allowed", req)
		}
	}
	ordinary := []uint64{0, 1, 0x5401 /* TCGETS */, 0x5413 /* TIOCGWINSZ */, 0x40049409, /* FICLONE */
		0x4020940d /* FICLONERANGE */, 0xc0189436 /* FIDEDUPERANGE */, 0x50009400, 0x50009402, 0x5000940d,
		0x5000940f, 0x50009416, 0x50009419, 0x7fffffff, 0x80000000, 0xffffffff,
		0xffffffff_c0189436 /* FIDEDUPERANGE as a negative int */, ^uint64(0)}
	for _, req := range ordinary {
		if !allowed(req) {
			t.Errorf("ioctl request %#x is refused", req)
		}
	}
	// The blocks cover [0, 2^32) but the refused requests exactly.
	var covered uint64
	for _, r := range rules {
		if a := r.Args[0]; a.Op == specs.OpMaskedEqual {
			covered += ^a.Value + 1
		}
	}
	if want := uint64(1<<32) - 4; covered != want {
		t.Errorf("the masked ioctl rules cover %d requests, want %d", covered, want)
	}
	t.Logf("%d ioctl rules", len(rules))
}

// TestBuildProfile: template builds may chroot (debootstrap does, into the
// job's own root) but make no namespace and no mount, as the executor may,
// and keep every other rule of the outer profile.
func TestBuildProfile(t *testing.T) {
	b, o := Build(), OCI()
	allowed := b.Syscalls[0].Names
	if !slices.Contains(allowed, "chroot") {
		t.Error("builds may not chroot")
	}
	for _, n := range []string{"mount", "umount2", "unshare", "setns"} {
		if slices.Contains(allowed, n) {
			t.Errorf("builds may call %s", n)
		}
	}
	if len(b.Syscalls) != len(o.Syscalls) || b.DefaultAction != o.DefaultAction {
		t.Errorf("the build profile has %d rules (default %s), the outer one %d (default %s)", len(b.Syscalls), b.DefaultAction, len(o.Syscalls), o.DefaultAction)
	}
	if slices.Contains(OCI().Syscalls[0].Names, "chroot") {
		t.Error("Build changed the outer profile")
	}
}
