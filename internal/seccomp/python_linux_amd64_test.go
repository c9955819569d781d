package seccomp

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// pythonInstaller installs the program in argv[1] the way the zygote does,
// with ctypes and prctl, then reports what works. It checks the format
// InnerFilter promises (a plain sock_filter array) and that glibc copes
// with clone3's ENOSYS when it starts threads and processes.
const pythonInstaller = `
import ctypes, errno, os, subprocess, sys, threading

PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
SYS_clone3, CLONE_NEWNS = 435, 0x20000
libc = ctypes.CDLL(None, use_errno=True)

def report(name, value):
    print("sbx-seccomp-result %s=%s" % (name, value), flush=True)

def result(r):
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]

class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

prog = open(sys.argv[1], "rb").read()
buf = ctypes.create_string_buffer(prog, len(prog))
fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
        libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
    report("install", result(-1))
    sys.exit(0)

status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
report("seccomp", status["Seccomp"].strip())
if status["Seccomp"].strip() != "2":
    sys.exit(0)
report("unshare", result(libc.unshare(CLONE_NEWNS)))
report("mount", result(libc.mount(b"none", b"/nonexistent-sbx-seccomp-test", b"tmpfs", 0, None)))
report("clone3", result(libc.syscall(SYS_clone3, None, 0)))

out = []
t = threading.Thread(target=out.append, args=("ok",))
t.start()
t.join()
report("thread", out[0] if out else "no")

report("subprocess", "ok" if subprocess.run(["/bin/true"]).returncode == 0 else "failed")
pid = os.fork()
if pid == 0:
    os._exit(7)
report("fork", "ok" if os.waitpid(pid, 0)[1] == 7 << 8 else "failed")
`

func TestInnerFilterFromPython(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the check is that calls root could make are refused")
	}
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		if python, err = exec.LookPath("python3"); err != nil {
			t.Skip("no python3 to install the filter from")
		}
	}
	prog, err := InnerFilter()
	if err != nil {
		t.Fatal(err)
	}
	progFile := filepath.Join(t.TempDir(), "inner.bpf")
	if err := os.WriteFile(progFile, prog, 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(python, "-c", pythonInstaller, progFile)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", python, err, out, stderr.Bytes())
	}
	got := parseResults(out)
	for name, want := range map[string]string{
		"seccomp":    "2",
		"unshare":    "EPERM",
		"mount":      "EPERM",
		"clone3":     "ENOSYS",
		"thread":     "ok",
		"subprocess": "ok",
		"fork":       "ok",
	} {
		if got[name] != want {
			t.Errorf("%s: got %q, want %q", name, got[name], want)
		}
	}
	if t.Failed() {
		t.Logf("python output:\n%s\nstderr:\n%s", out, stderr.Bytes())
	}
}
