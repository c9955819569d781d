package seccomp

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The workload the allowlist exists for, run the way user code runs: a
// Python process (the zygote's stand-in) drops to uid 1000, installs the
// inner filter with ctypes and execs bash, which runs coreutils and then
// Python with numpy, pandas and matplotlib.
const (
	workloadInstall = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
prog = open("/w/inner.bpf", "rb").read()
buf = ctypes.create_string_buffer(prog, len(prog))
fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
os.setgroups([])
os.setgid(1000)
os.setuid(1000)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "install inner filter")
os.execv("/bin/bash", ["bash", "/w/work.sh"])
`
	workloadShell = `set -eu
ls -la / >/dev/null; cp /etc/passwd /tmp/p; sort </tmp/p | wc -l; date >/dev/null; sleep 0
mkdir -p /tmp/d/e; touch /tmp/d/e/f; find /tmp/d | wc -l; tar -C /tmp -cf /tmp/a.tar d; tar -tf /tmp/a.tar | wc -l
grep -c root /tmp/p; sed -n 1p /tmp/p >/dev/null; head -c 16 /dev/urandom | od >/dev/null
ln -s /tmp/p /tmp/l; readlink /tmp/l; chmod 600 /tmp/p; stat /tmp/p >/dev/null; du -s /tmp >/dev/null; df /tmp >/dev/null
mkfifo /tmp/fifo; id -u; uname -a >/dev/null; nproc; nice true; env >/dev/null
grep -E "^Seccomp(_filters)?:" /proc/self/status
python3 /w/work.py
echo workload ok
`
	workloadPython = `
import ctypes, multiprocessing, os, signal, socket, subprocess, tempfile, threading, time
import numpy as np, pandas as pd
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

a = np.random.rand(400, 400)
print("numpy", (a @ a.T).shape, np.linalg.eigvalsh(a[:20, :20] @ a[:20, :20].T).shape)
df = pd.DataFrame({"k": np.arange(1000) % 7, "v": np.random.rand(1000)})
df.to_csv("/tmp/x.csv")
print("pandas", pd.read_csv("/tmp/x.csv").groupby("k").v.mean().shape)
fig, ax = plt.subplots()
ax.plot([1, 2, 3])
fig.savefig("/tmp/p.png")
print("matplotlib", os.path.getsize("/tmp/p.png") > 0)

def square(x):
    return x * x

with multiprocessing.Pool(2) as pool:
    print("pool", sum(pool.map(square, range(10))))
t = threading.Thread(target=print, args=("thread",))
t.start()
t.join()
print("subprocess", subprocess.run(["bash", "-c", "echo hi | tr a-z A-Z"], capture_output=True, text=True).stdout.strip())
s1, s2 = socket.socketpair()
s1.send(b"x")
print("socketpair", s2.recv(1))
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
socket.create_connection(srv.getsockname()).close()
print("tcp", socket.getaddrinfo("localhost", 80)[0][0])
with tempfile.TemporaryDirectory() as d:
    open(d + "/f", "w").write("x")
signal.signal(signal.SIGALRM, lambda *a: None)
signal.setitimer(signal.ITIMER_REAL, 0.001)
time.sleep(0.01)
print("affinity", len(os.sched_getaffinity(0)) > 0)
libc = ctypes.CDLL(None, use_errno=True)
# CLONE_NEWUSER needs no capability, so only the inner filter refuses it.
refused = libc.unshare(0x10000000) != 0 and ctypes.get_errno() == 1
print("unshare", "refused" if refused else "allowed")
`
)

func TestOCIProfileRunsWorkload(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Python with numpy, pandas and matplotlib in a container")
	}
	runc := requireRunc(t)
	if err := exec.Command("/usr/bin/python3", "-c", "import numpy, pandas, matplotlib").Run(); err != nil {
		t.Skip("needs /usr/bin/python3 with numpy, pandas and matplotlib on the host")
	}
	prog, err := InnerFilter()
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	for name, data := range map[string][]byte{
		"inner.bpf":  prog,
		"install.py": []byte(workloadInstall),
		"work.sh":    []byte(workloadShell),
		"work.py":    []byte(workloadPython),
	} {
		if err := os.WriteFile(filepath.Join(work, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// uid 1000 must be able to read the scripts.
	if err := os.Chmod(work, 0o755); err != nil {
		t.Fatal(err)
	}

	// The host's /usr and /etc, read-only, stand in for a template rootfs.
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, dir := range []string{"usr", "etc", "proc", "dev", "tmp", "w"} {
		if err := os.MkdirAll(filepath.Join(rootfs, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// runc gives a tmpfs the mode of the directory it covers.
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	spec := sandboxSpec(OCI(), []string{"CAP_SETUID", "CAP_SETGID"})
	for _, dir := range []string{"bin", "lib", "lib64", "sbin"} {
		// merged /usr: keep the host's symlinks; otherwise mount the dir.
		if target, err := os.Readlink("/" + dir); err == nil {
			if err := os.Symlink(target, filepath.Join(rootfs, dir)); err != nil {
				t.Fatal(err)
			}
		} else if _, err := os.Stat("/" + dir); err == nil {
			if err := os.Mkdir(filepath.Join(rootfs, dir), 0o755); err != nil {
				t.Fatal(err)
			}
			spec.Mounts = append(spec.Mounts, bindRO("/"+dir, "/"+dir))
		}
	}
	spec.Mounts = append(spec.Mounts, bindRO("/usr", "/usr"), bindRO("/etc", "/etc"), bindRO(work, "/w"))
	spec.Process.Args = []string{"/usr/bin/python3", "/w/install.py"}
	spec.Process.Cwd = "/tmp"
	spec.Process.Env = append(spec.Process.Env, "HOME=/tmp", "MPLCONFIGDIR=/tmp/mpl")

	out := string(runContainer(t, runc, bundle, spec))
	for _, want := range []string{
		"Seccomp:\t2", "Seccomp_filters:\t2", "numpy (400, 400)", "pandas (7,)", "matplotlib True", "pool 285", "thread",
		"subprocess HI", "socketpair b'x'", "tcp 2", "affinity True", "unshare refused", "workload ok",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("workload output lacks %q", want)
		}
	}
}

func bindRO(source, dest string) specs.Mount {
	return specs.Mount{Destination: dest, Type: "bind", Source: source, Options: []string{"rbind", "ro", "nosuid", "nodev"}}
}
