// Package seccomp holds the two system-call filters every sandbox runs under.
//
// The outer profile (OCI) is given to the OCI runtime and applies to every
// process of the sandbox, the executor included: a default-deny allowlist
// read from profile.json. The executor and its Python zygote need a few
// namespace and mount calls that user code must never make, so those are in
// the outer allowlist too (executor_only) and a second, inner filter
// (InnerFilter) takes them away again in each user process before it runs
// untrusted code. Seccomp filters stack and the kernel applies the strictest
// answer, so user code gets the intersection of the two.
//
// The inner filter is plain classic BPF built in Go, because the executor is
// a static binary without libseccomp, and because the zygote installs it
// from Python with prctl.
package seccomp

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// profileJSON is data, not code, so that a change to what sandboxes may call
// is reviewed as a diff of names.
//
//go:embed profile.json
var profileJSON []byte

type profile struct {
	// Comment documents the file; JSON has no comments.
	Comment      []string `json:"comment"`
	Allow        []string `json:"allow"`
	ExecutorOnly []string `json:"executor_only"`
}

// loaded is parsed once at start-up: the file is compiled into the binary, so
// a parse error is a build defect that the tests catch, not a runtime
// condition a caller could handle.
var loaded = mustParse(profileJSON)

func parseProfile(data []byte) (*profile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// A misspelt key ("executor-only") must not silently empty a list.
	dec.DisallowUnknownFields()
	var p profile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("seccomp: parse profile.json: %w", err)
	}
	if len(p.Allow) == 0 {
		return nil, fmt.Errorf("seccomp: profile.json: empty allow list")
	}
	return &p, nil
}

func mustParse(data []byte) *profile {
	p, err := parseProfile(data)
	if err != nil {
		panic(err)
	}
	return p
}

// Names returns copies of the two lists in profile.json: allow is what user
// code may call, executorOnly what only the executor and zygote may call.
// The outer profile allows both; the inner filter refuses executorOnly.
// socket, personality and ioctl are in neither: OCI allows them with
// argument rules.
func Names() (allow, executorOnly []string) {
	return slices.Clone(loaded.Allow), slices.Clone(loaded.ExecutorOnly)
}

// eperm is EPERM on every Linux architecture. It is spelt out so that this
// file, which only produces data for the OCI runtime, builds on any GOOS.
const eperm = 1

// OCI returns the outer seccomp profile for the OCI runtime (runc), a fresh
// value on each call so that callers may change it.
//
// Architectures lists only SCMP_ARCH_X86_64. Sandboxes run amd64 binaries
// only, and the i386 (int 0x80) and x32 entry points are extra kernel attack
// surface with their own compat code paths. With x86 and x32 left out,
// libseccomp sends any i386 or x32 system call to its bad-architecture
// action, which kills the calling thread, instead of checking it against
// a second allowlist. runc accepts this; measured under runc 1.1.5, an x32
// getpid dies of SIGSYS (the kernel here has no i386 emulation at all).
func OCI() *specs.LinuxSeccomp {
	errnoRet := uint(eperm)
	names := make([]string, 0, len(loaded.Allow)+len(loaded.ExecutorOnly))
	names = append(names, loaded.Allow...)
	names = append(names, loaded.ExecutorOnly...)
	slices.Sort(names)
	return &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &errnoRet,
		Architectures:   []specs.Arch{specs.ArchX86_64},
		Syscalls: append([]specs.LinuxSyscall{
			{Names: names, Action: specs.ActAllow},
		}, append(conditionalRules(), ioctlRules()...)...),
	}
}

// buildOnly are what template builds (oci jobs) may call beyond what user
// code may: debootstrap's second stage runs every command through chroot,
// into the job's own root. A job's root is a pivot_root'ed rootfs in a
// mount namespace of its own, so chroot leads nowhere outside it.
var buildOnly = []string{"chroot"}

// Build returns the seccomp profile of template builds: what user code
// may call (OCI's profile without the executor's namespace and mount
// calls: a build is no executor, and makes no namespace), plus buildOnly.
func Build() *specs.LinuxSeccomp {
	p := OCI()
	names := slices.DeleteFunc(slices.Clone(p.Syscalls[0].Names), func(n string) bool { return slices.Contains(loaded.ExecutorOnly, n) })
	p.Syscalls[0].Names = append(names, buildOnly...)
	slices.Sort(p.Syscalls[0].Names)
	return p
}

// ioctlRules allow ioctl for every request but the btrfs subvolume and
// snapshot ones, which get the profile's default answer, EPERM.
//
// They cannot be an unconditional allow plus errno rules, nor ranges:
// libseccomp 2.5 (runc 1.1) lets an unconditional allow of a syscall win
// over argument rules of the same syscall with another action (and over an
// "always true" argument rule too), and keeps one comparison per argument
// in a rule, so a rule cannot say "above this and below that"
// (TestOCIProfileUnderRunc saw the btrfs requests pass in all three
// shapes). What it does do is OR rules: the allowed requests are spelt
// out as aligned blocks, each one masked compare of all 64 bits. The
// kernel reads the request's low 32 bits, so a value with a high bit set
// could alias a refused request: those are refused, except the sign
// extension of a negative int (some libcs pass the request as an int),
// whose low half is 0x80000000 or more, where no refused request lies.
func ioctlRules() []specs.LinuxSyscall {
	reqs := slices.Clone(btrfsCreateIoctls)
	slices.Sort(reqs)
	var rules []specs.LinuxSyscall
	allow := func(arg specs.LinuxSeccompArg) {
		rules = append(rules, specs.LinuxSyscall{Names: []string{"ioctl"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{arg}})
	}
	from := uint64(0)
	ends := make([]uint64, 0, len(reqs)+1)
	for _, req := range reqs {
		ends = append(ends, uint64(req))
	}
	for _, end := range append(ends, 1<<32) {
		for _, b := range alignedBlocks(from, end) {
			// runc passes Value then ValueTwo to libseccomp: (arg & Value) == ValueTwo.
			allow(specs.LinuxSeccompArg{Index: 1, Value: b.mask, ValueTwo: b.start, Op: specs.OpMaskedEqual})
		}
		from = end + 1
	}
	allow(specs.LinuxSeccompArg{Index: 1, Value: signExtendedInts, Op: specs.OpGreaterEqual})
	return rules
}

type block struct{ start, mask uint64 }

// alignedBlocks splits [lo, hi) into blocks of a power-of-two size aligned
// on their size, each described by the mask that selects it.
func alignedBlocks(lo, hi uint64) []block {
	var out []block
	for lo < hi {
		size := uint64(1)
		for lo%(size*2) == 0 && lo+size*2 <= hi {
			size *= 2
		}
		out = append(out, block{start: lo, mask: ^(size - 1)})
		lo += size
	}
	return out
}

// Argument values for the rules below, spelt out for the same reason as
// eperm; the tests compare them with golang.org/x/sys/unix.
const (
	afUnix    = 1
	afInet    = 2
	afInet6   = 10
	afNetlink = 16

	// personality(2) values that change nothing that matters: PER_LINUX,
	// PER_LINUX32, UNAME26, PER_LINUX32|UNAME26 and the 0xffffffff query.
	// Everything else (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, ...) weakens
	// the process's own exploit mitigations. Same set as Docker's profile.
	perLinux        = 0x0
	perLinux32      = 0x8
	perUname26      = 0x20000
	perLinux32Uname = 0x20008
	perQuery        = 0xffffffff

	// signExtendedInts is where a negative 32-bit int lands when it is
	// passed as a 64-bit argument.
	signExtendedInts = 0xffffffff80000000
)

// socketFamilies are the address families user code may open. Everything
// else is refused; AF_VSOCK above all, because vsock is not confined by the
// network namespace and would reach services of the host or hypervisor.
var socketFamilies = []uint64{afUnix, afInet, afInet6, afNetlink}

var personalities = []uint64{perLinux, perLinux32, perUname26, perLinux32Uname, perQuery}

// btrfsCreateIoctls make a btrfs subvolume or snapshot: BTRFS_IOC_SNAP_CREATE,
// SUBVOL_CREATE, SNAP_CREATE_V2 and SUBVOL_CREATE_V2. btrfs lets any user
// make one in a directory they can write, and a subvolume inside a
// workspace is outside the workspace's quota: nothing in a sandbox
// may, the executor and the zygote included. ioctl's request is an
// unsigned int, so its low 32 bits are what the kernel reads. The other
// btrfs ioctls stay allowed; FICLONE (reflink copies) above all.
var btrfsCreateIoctls = []uint32{0x50009401, 0x5000940e, 0x50009417, 0x50009418}

// conditionalRules returns the allow rules that depend on an argument. Each
// entry is one rule; the kernel allows the call if any of them matches.
//
// The socket family is an int and the kernel ignores the upper 32 bits of
// the register, while seccomp compares all 64. A "family != AF_VSOCK" rule
// (Docker's) can therefore be dodged by setting a high bit; an allowlist of
// families compared on the low 32 bits (SCMP_CMP_MASKED_EQ with mask
// 0xffffffff) cannot. personality is compared on all 64 bits with EQ, which
// fails closed if a high bit is set.
func conditionalRules() []specs.LinuxSyscall {
	var rules []specs.LinuxSyscall
	for _, family := range socketFamilies {
		rules = append(rules, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			// runc passes Value then ValueTwo to libseccomp, whose
			// masked compare is (arg & Value) == ValueTwo.
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, ValueTwo: family, Op: specs.OpMaskedEqual}},
		})
	}
	for _, persona := range personalities {
		rules = append(rules, specs.LinuxSyscall{
			Names:  []string{"personality"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: persona, Op: specs.OpEqualTo}},
		})
	}
	return rules
}
