// Command probe runs as PID 1 of a test container and reports, one
// "sbx-seccomp-result name=value" line each, what it can and cannot do.
// The test (runc_linux_amd64_test.go) decides what is right; the probe only
// reports, so that the same binary serves the control run without seccomp.
//
// The refused calls use arguments that fail harmlessly with an errno other
// than EPERM when nothing filters them, so that EPERM means seccomp.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		fmt.Print("child-ok")
		return
	}
	report("seccomp", statusField("Seccomp"))
	report("no_new_privs", statusField("NoNewPrivs"))

	// Ordinary work.
	report("goroutines", goroutines())
	report("files", files())
	report("exec self", execSelf(0))
	report("socket AF_UNIX", socket(unix.AF_UNIX, unix.SOCK_STREAM))
	report("socket AF_INET", socket(unix.AF_INET, unix.SOCK_STREAM))
	report("socket AF_NETLINK", socket(unix.AF_NETLINK, unix.SOCK_RAW))
	report("personality query", errno(unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)))
	// An ioctl the profile lets through: on a tmpfs file FICLONE fails
	// with EXDEV or EOPNOTSUPP, never EPERM.
	report("ioctl FICLONE", ioctl(unix.FICLONE))

	// Only meaningful with CAP_SYS_ADMIN, which the executor has: the
	// profile must let it mount and make namespaces.
	if os.Getenv("PROBE_PRIVILEGED") != "" {
		err := unix.Mount("tmpfs", "/mnt", "tmpfs", 0, "size=1m")
		if err == nil {
			err = unix.Unmount("/mnt", 0)
		}
		report("mount", name(err))
		report("exec in new namespaces", execSelf(unix.CLONE_NEWNS|unix.CLONE_NEWUTS|unix.CLONE_NEWIPC))
	}

	// Calls the profile refuses. Unfiltered, ptrace fails with ESRCH, bpf
	// with EINVAL, keyctl with EOPNOTSUPP, perf_event_open and
	// io_uring_setup with EFAULT.
	report("ptrace", errno(unix.Syscall(unix.SYS_PTRACE, 0xdead, 0, 0)))
	report("bpf", errno(unix.Syscall(unix.SYS_BPF, 9999, 0, 0)))
	report("keyctl", errno(unix.Syscall(unix.SYS_KEYCTL, 0xdead, 0, 0)))
	report("perf_event_open", errno(unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0)))
	report("io_uring_setup", errno(unix.Syscall(unix.SYS_IO_URING_SETUP, 0, 0, 0)))
	report("socket AF_VSOCK", socket(unix.AF_VSOCK, unix.SOCK_STREAM))
	// Unfiltered, a btrfs ioctl on a tmpfs directory fails with ENOTTY.
	report("ioctl BTRFS_IOC_SUBVOL_CREATE", ioctl(btrfsIocSubvolCreate))
	report("ioctl BTRFS_IOC_SNAP_CREATE_V2 high bits", ioctl(1<<32|btrfsIocSnapCreateV2))
	// The kernel reads the family as an int; a rule comparing 64 bits
	// would see a family that is not AF_VSOCK.
	report("socket AF_VSOCK high bits", socket(1<<32|unix.AF_VSOCK, unix.SOCK_STREAM))
	// Left for last: unfiltered, these succeed and change the persona of
	// this process, which execs nothing after them.
	report("personality high bits", errno(unix.Syscall(unix.SYS_PERSONALITY, 1<<32, 0, 0)))
	report("personality ADDR_NO_RANDOMIZE", errno(unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0)))
}

// btrfs ioctl requests (linux/btrfs.h).
const (
	btrfsIocSubvolCreate = 0x5000940e
	btrfsIocSnapCreateV2 = 0x50009417
)

// ioctl calls request on /tmp (a directory) or a file in it; the
// argument is a zeroed buffer big enough for any of the requests.
func ioctl(request uint64) string {
	dir, err := os.Open("/tmp")
	if err != nil {
		return name(err)
	}
	defer dir.Close()
	f, err := os.CreateTemp("/tmp", "probe")
	if err != nil {
		return name(err)
	}
	defer f.Close()
	buf := make([]byte, 8192)
	fd, arg := dir.Fd(), uintptr(unsafe.Pointer(&buf[0]))
	if request == unix.FICLONE {
		fd, arg = f.Fd(), dir.Fd()
	}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(request), arg)
	return errno(0, 0, e)
}

// addrNoRandomize is ADDR_NO_RANDOMIZE from <linux/personality.h>.
const addrNoRandomize = 0x0040000

func report(key, value string) { fmt.Printf("sbx-seccomp-result %s=%s\n", key, value) }

func name(err error) string {
	if err == nil {
		return "ok"
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return unix.ErrnoName(e)
	}
	return err.Error()
}

func errno(_, _ uintptr, e syscall.Errno) string {
	if e == 0 {
		return "ok"
	}
	return unix.ErrnoName(e)
}

// socket opens and closes a socket. family is a uint64 so that the upper
// half of the register can be set too.
func socket(family uint64, typ int) string {
	fd, _, e := unix.Syscall(unix.SYS_SOCKET, uintptr(family), uintptr(typ|unix.SOCK_CLOEXEC), 0)
	if e == 0 {
		unix.Close(int(fd))
	}
	return errno(0, 0, e)
}

func goroutines() string {
	var wg sync.WaitGroup
	sums := make([]int, 16)
	for i := range sums {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 100000 {
				sums[i] += j
			}
		}()
	}
	wg.Wait()
	for _, s := range sums {
		if s != 4999950000 {
			return "wrong sum"
		}
	}
	return "ok"
}

func files() string {
	if err := os.WriteFile("/tmp/probe-data", []byte("hello"), 0o600); err != nil {
		return name(err)
	}
	data, err := os.ReadFile("/tmp/probe-data")
	if err != nil {
		return name(err)
	}
	if string(data) != "hello" {
		return "read back " + string(data)
	}
	if _, err := os.ReadFile("/probe"); err != nil {
		return name(err)
	}
	return "ok"
}

func execSelf(cloneflags uintptr) string {
	self, err := os.Executable()
	if err != nil {
		return name(err)
	}
	cmd := exec.Command(self, "child")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags}
	out, err := cmd.Output()
	if err != nil {
		return name(err)
	}
	if string(out) != "child-ok" {
		return "child said " + string(out)
	}
	return "ok"
}

func statusField(field string) string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return name(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
