package seccomp

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// childEnv makes a re-executed test binary run innerChild instead of the
// tests: a seccomp filter cannot be removed, so it is tried in a process of
// its own.
const childEnv = "SBX_SECCOMP_CHILD"

// resultPrefix marks the child's report lines among whatever else the test
// binary prints.
const resultPrefix = "sbx-seccomp-result "

// A path that exists nowhere, so that mount and umount2 are harmless
// (ENOENT) should the filter not be there.
const nowhere = "/nonexistent-sbx-seccomp-test"

func TestInnerFilterInstalled(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		innerChild()
		return
	}
	if os.Geteuid() != 0 {
		// As root, nothing but the filter answers these calls with EPERM,
		// which is what makes the EPERMs meaningful.
		t.Skip("needs root: the check is that calls root could make are refused")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInnerFilterInstalled$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.Bytes())
	}
	got := parseResults(out)

	want := map[string]string{
		"seccomp":        "2",
		"all threads":    "ok",
		"no_new_privs":   "1",
		"unshare":        "EPERM",
		"mount":          "EPERM",
		"umount2":        "EPERM",
		"setns":          "EPERM",
		"clone3":         "ENOSYS",
		"x32 getpid":     "EPERM",
		"open file":      "ok",
		"exec /bin/true": "ok",
		"new threads":    "ok",
		// Go starts a child in a new time namespace with clone3, which
		// gets ENOSYS; Go does not fall back to clone.
		"exec with CLONE_NEWTIME": "ENOSYS",
	}
	for _, f := range namespaceFlags {
		want["exec with "+f.name] = "EPERM"
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: got %q, want %q", name, got[name], w)
		}
	}
	if t.Failed() {
		t.Logf("child output:\n%s", out)
	}
}

// namespaceFlags are the clone flags that make a namespace, but for
// CLONE_NEWTIME, which Go passes with clone3 and which is tested apart.
var namespaceFlags = []struct {
	name string
	flag uintptr
}{
	{"CLONE_NEWNS", unix.CLONE_NEWNS}, {"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP},
	{"CLONE_NEWUTS", unix.CLONE_NEWUTS}, {"CLONE_NEWIPC", unix.CLONE_NEWIPC},
	{"CLONE_NEWUSER", unix.CLONE_NEWUSER}, {"CLONE_NEWPID", unix.CLONE_NEWPID},
	{"CLONE_NEWNET", unix.CLONE_NEWNET},
}

func parseResults(out []byte) map[string]string {
	got := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), resultPrefix)
		if !ok {
			continue
		}
		if name, value, ok := strings.Cut(line, "="); ok {
			got[name] = value
		}
	}
	return got
}

// innerChild installs the inner filter in this process and reports what
// works and what does not. The parent decides what is right.
func innerChild() {
	report := func(name, value string) { fmt.Printf("%s%s=%s\n", resultPrefix, name, value) }
	prog, err := InnerFilter()
	if err != nil {
		report("install", err.Error())
		return
	}
	if err := Install(prog); err != nil {
		report("install", err.Error())
		return
	}
	seccompMode := statusField("/proc/self/status", "Seccomp")
	report("seccomp", seccompMode)
	report("no_new_privs", statusField("/proc/self/status", "NoNewPrivs"))
	report("all threads", allThreadsFiltered())
	if seccompMode != "2" {
		return // Nothing below should run as root unfiltered.
	}

	report("unshare", errnoName(unix.Unshare(unix.CLONE_NEWNS)))
	report("mount", errnoName(unix.Mount("none", nowhere, "tmpfs", 0, "")))
	report("umount2", errnoName(unix.Unmount(nowhere, 0)))
	report("setns", errnoName(unix.Setns(-1, 0)))
	_, _, e := unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	report("clone3", errnoName(e))
	_, _, e = unix.Syscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
	report("x32 getpid", errnoName(e))
	for _, f := range namespaceFlags {
		report("exec with "+f.name, errnoName(runTrue(f.flag)))
	}
	report("exec with CLONE_NEWTIME", errnoName(runTrue(unix.CLONE_NEWTIME)))

	_, err = os.ReadFile(os.Args[0])
	report("open file", errnoName(err))
	report("exec /bin/true", errnoName(runTrue(0)))
	report("new threads", newThreads())
}

func runTrue(cloneflags uintptr) error {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags}
	return cmd.Run()
}

// newThreads checks that the process can start OS threads under the filter.
// It locks more goroutines to threads than the process has threads, so the
// runtime must create some; the main goroutine needs one more.
func newThreads() string {
	n := countTasks() + 2
	var started, done sync.WaitGroup
	release := make(chan struct{})
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			started.Done()
			<-release
		}()
	}
	started.Wait()
	have := countTasks()
	close(release)
	done.Wait()
	if have < n+1 {
		return fmt.Sprintf("%d goroutines locked to threads, but only %d threads", n, have)
	}
	return "ok"
}

func countTasks() int {
	tasks, _ := os.ReadDir("/proc/self/task")
	return len(tasks)
}

// allThreadsFiltered checks that TSYNC reached every thread of the process.
func allThreadsFiltered() string {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err.Error()
	}
	for _, task := range tasks {
		status := filepath.Join("/proc/self/task", task.Name(), "status")
		if mode := statusField(status, "Seccomp"); mode != "2" {
			return fmt.Sprintf("thread %s has Seccomp %q", task.Name(), mode)
		}
	}
	return "ok"
}

// statusField returns a field of a /proc/<pid>/status file, or "" if absent.
func statusField(path, field string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// errnoName reports an error as the name of its errno ("EPERM"), "ok" for
// nil, and the message for anything else.
func errnoName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if errno == 0 {
			return "ok"
		}
		return unix.ErrnoName(errno)
	}
	return err.Error()
}
