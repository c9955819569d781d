package template

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// buildEnv is the whole environment of every build command: nothing of the
// caller's environment (proxies, locales, a TERM) leaks into a build.
var buildEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LC_ALL=C",
	"DEBIAN_FRONTEND=noninteractive",
	"DEBCONF_NONINTERACTIVE_SEEN=true",
}

// inRootScript runs a command chrooted into a rootfs ($1) with /proc and a
// minimal /dev mounted. It runs in a private mount namespace of its own, so
// the mounts exist only while it runs and vanish with it however it ends
// (error, cancellation, a crash of sbx): nothing is ever left mounted in a
// build directory, and removing one can never reach into the host's /proc
// or /dev. /dev is a fresh tmpfs rather than a bind of the host's, so that
// no maintainer script can touch the host's devices.
const inRootScript = `set -e
r=$1; shift
mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=1m sbx-dev "$r/dev"
mk() { mknod -m 0666 "$r/dev/$1" c "$2" "$3"; }
mk null 1 3; mk zero 1 5; mk full 1 7; mk random 1 8; mk urandom 1 9; mk tty 5 0
ln -s /proc/self/fd "$r/dev/fd"
ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"
ln -s /proc/self/fd/2 "$r/dev/stderr"
mkdir -m 0755 "$r/dev/pts"
mkdir -m 1777 "$r/dev/shm"
exec chroot "$r" "$@"
`

// runner runs a build's commands. Their output goes to progress line by
// line, and the last lines are kept for the error message, since progress
// may well be io.Discard.
type runner struct {
	progress *progress
}

// run runs name with args in a private mount namespace and its own process
// group, which is killed as a whole when ctx ends: apt's dpkg and the
// maintainer scripts it runs must not outlive a cancelled build. what names
// the command in errors.
func (r *runner) run(ctx context.Context, what string, stdin io.Reader, stdout io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = buildEnv
	cmd.Stdin = stdin // nil is /dev/null: nothing may prompt
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	lw := &lineWriter{p: r.progress}
	cmd.Stderr = lw
	cmd.Stdout = lw
	if stdout != nil {
		cmd.Stdout = stdout
	}
	err := cmd.Run()
	lw.flush()
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		return fmt.Errorf("%s: %w%s", what, err, lw.tailText())
	}
	return nil
}

// inRoot runs args chrooted into root, with /proc and /dev mounted.
func (r *runner) inRoot(ctx context.Context, what, root string, stdin io.Reader, args ...string) error {
	return r.run(ctx, what, stdin, nil, "/bin/sh", append([]string{"-c", inRootScript, "sbx-build", root}, args...)...)
}

// inRootOutput is inRoot that returns the command's standard output.
func (r *runner) inRootOutput(ctx context.Context, what, root string, args ...string) (string, error) {
	var out bytes.Buffer
	err := r.run(ctx, what, nil, &out, "/bin/sh", append([]string{"-c", inRootScript, "sbx-build", root}, args...)...)
	return out.String(), err
}

// lineWriter copies command output to progress, indented, a line at a
// time, and remembers the last tailLines lines.
type lineWriter struct {
	p    *progress
	buf  []byte
	tail []string
}

const tailLines = 15

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexAny(w.buf, "\r\n")
		if i < 0 {
			break
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}

func (w *lineWriter) flush() {
	if len(w.buf) > 0 {
		w.line(string(w.buf))
		w.buf = nil
	}
}

func (w *lineWriter) line(s string) {
	s = strings.TrimRight(s, " \t")
	if s == "" {
		return
	}
	w.p.printf("    %s\n", s)
	if len(w.tail) == tailLines {
		w.tail = w.tail[1:]
	}
	w.tail = append(w.tail, s)
}

func (w *lineWriter) tailText() string {
	if len(w.tail) == 0 {
		return ""
	}
	return "; last output:\n    " + strings.Join(w.tail, "\n    ")
}

// progress writes a build's human-readable log: numbered steps, each with
// its elapsed time at the end, and the commands' output in between.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	total int
}

func newProgress(w io.Writer, total int) *progress {
	if w == nil {
		w = io.Discard
	}
	return &progress{w: w, total: total}
}

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// step announces step n and returns the function that reports its end.
func (p *progress) step(n int, format string, args ...any) (done func()) {
	start := time.Now()
	p.printf("[%d/%d] %s\n", n, p.total, fmt.Sprintf(format, args...))
	return func() {
		p.printf("[%d/%d] done in %s\n", n, p.total, time.Since(start).Round(100*time.Millisecond))
	}
}
