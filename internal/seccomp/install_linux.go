package seccomp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// seccompSetModeFilter is SECCOMP_SET_MODE_FILTER from <linux/seccomp.h>,
// which golang.org/x/sys/unix does not define.
const seccompSetModeFilter = 1

// sizeofSockFilter is the size of struct sock_filter: u16 code, u8 jt, u8 jf, u32 k.
const sizeofSockFilter = 8

// Install loads prog, an array of struct sock_filter such as InnerFilter
// returns, as a seccomp filter on every thread of the calling process.
//
// It sets no_new_privs first. The kernel requires it (or CAP_SYS_ADMIN) to
// install a filter, so that a filtered process cannot exec a setuid program
// with calls denied that the program relies on (a failing setuid(2), say).
// Both no_new_privs and the filter last for the life of the process and are
// inherited by its children.
//
// Filters are synchronised to all threads (SECCOMP_FILTER_FLAG_TSYNC)
// because the Go runtime runs goroutines on threads it picks: a filter on one
// thread only would protect nothing.
func Install(prog []byte) error {
	if len(prog) == 0 || len(prog)%sizeofSockFilter != 0 {
		return fmt.Errorf("seccomp: program of %d bytes is not a whole number of %d-byte instructions: %w",
			len(prog), sizeofSockFilter, errdefs.ErrInvalidArgument)
	}
	n := len(prog) / sizeofSockFilter
	if n > unix.BPF_MAXINSNS {
		return fmt.Errorf("seccomp: program has %d instructions, the kernel takes at most %d: %w",
			n, unix.BPF_MAXINSNS, errdefs.ErrInvalidArgument)
	}
	// Decode into a typed slice rather than pointing the kernel at prog:
	// a []byte carries no alignment guarantee for struct sock_filter.
	insns := make([]unix.SockFilter, n)
	for i := range insns {
		b := prog[i*sizeofSockFilter:]
		insns[i] = unix.SockFilter{
			Code: binary.NativeEndian.Uint16(b[0:]),
			Jt:   b[2],
			Jf:   b[3],
			K:    binary.NativeEndian.Uint32(b[4:]),
		}
	}
	fprog := unix.SockFprog{Len: uint16(n), Filter: &insns[0]}

	// no_new_privs is per thread. TSYNC copies it to the other threads only
	// if the thread calling seccomp(2) has it, so both calls must run on the
	// same thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("seccomp: set no_new_privs: %w", err)
	}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, seccompSetModeFilter,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(insns)
	if errno != 0 {
		return fmt.Errorf("seccomp: install filter: %w", errno)
	}
	if r != 0 {
		// With TSYNC, a positive return is the id of a thread whose filters
		// could not be synchronised; nothing was installed.
		return fmt.Errorf("seccomp: install filter: thread %d cannot be synchronised: %w", r, errdefs.ErrFailedPrecondition)
	}
	return nil
}
