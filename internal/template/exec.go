package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/egress"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"golang.org/x/sys/unix"
)

// buildEnv is the base environment of every build command: nothing of the
// caller's environment (proxies, locales, a TERM) leaks into a build.
var buildEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LC_ALL=C",
	"DEBIAN_FRONTEND=noninteractive",
	"DEBCONF_NONINTERACTIVE_SEEN=true",
}

// JobRunner runs a build's commands: each one a container of its own
// (runtime.Job; the OCI driver's RunJob), never a process of the host's.
type JobRunner func(ctx context.Context, job runtime.Job) error

// buildJobTmpMB is the size of each build command's /tmp.
const buildJobTmpMB = 512

// box runs one build's commands, each in a job: root of a user namespace
// of its own with no capability on the host, under seccomp, with the
// job's own /proc and /dev, and no network but the package mirror,
// reached through a proxy that serves nothing else (internal/egress).
// Nothing a build runs, Debian's maintainer scripts included, runs as the
// host's root or sees the host's /proc.
type box struct {
	run      JobRunner
	progress *progress
	netns    *egress.NetNS
	proxy    *egress.Proxy
	env      []string
	memoryMB int64
}

// newBox makes a build's network (a namespace with only loopback, and a
// proxy to the origins of mirrors) and returns the box that runs its
// commands. memoryMB bounds each command, the build area's tmpfs pages
// that it writes included (they are charged to the writer).
func newBox(run JobRunner, p *progress, mirrors []string, memoryMB int64) (*box, error) {
	if run == nil {
		return nil, fmt.Errorf("template builds need an OCI runtime on this server, which has none (sandboxes on Kubernetes: build on a host with runc, then provide the image with sbx image push): %w", errdefs.ErrUnavailable)
	}
	ns, err := egress.NewNetNS()
	if err != nil {
		return nil, fmt.Errorf("the build's network: %w", err)
	}
	proxy, err := egress.NewProxy(mirrors, func(what string) { p.printf("    sbx: the build's network refused %s\n", what) })
	if err != nil {
		ns.Close()
		return nil, err
	}
	proxy.Serve(ns.Listener)
	url := fmt.Sprintf("http://127.0.0.1:%d/", ns.Port)
	env := append(slices.Clone(buildEnv), "http_proxy="+url, "https_proxy="+url)
	return &box{run: run, progress: p, netns: ns, proxy: proxy, env: env, memoryMB: memoryMB}, nil
}

func (b *box) close() {
	b.proxy.Close()
	b.netns.Close()
}

// job returns the job that runs args as root of rootfs.
func (b *box) job(rootfs string, stdin io.Reader, stdout io.Writer, args ...string) runtime.Job {
	return runtime.Job{
		Root: rootfs, Args: args, Env: b.env, Stdin: stdin, Stdout: stdout,
		NetNS:     b.netns.Path(),
		Resources: runtime.Resources{MemoryMB: b.memoryMB, TmpMB: buildJobTmpMB},
	}
}

// errNoSpace is a build command that ran out of room in the build's area.
var errNoSpace = fmt.Errorf("no space left in the build's area: %w", unix.ENOSPC)

// exec runs a job; its output goes to progress line by line, and the last
// lines go into the error. what names the command in errors. A command
// that says it found no space has passed the build's limit: it is stopped
// there (apt-get update, for one, may wait for ever after such a write
// failed), and the error says so. The tools say it only in their output.
func (b *box) exec(ctx context.Context, what string, job runtime.Job) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	lw := &lineWriter{p: b.progress, noSpace: func() { cancel(errNoSpace) }}
	job.Stderr = lw
	if job.Stdout == nil {
		job.Stdout = lw
	}
	err := b.run(ctx, job)
	lw.flush()
	if errors.Is(context.Cause(ctx), errNoSpace) {
		return fmt.Errorf("%s: %w%s", what, errNoSpace, lw.tailText())
	}
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		}
		return fmt.Errorf("%s: %w%s", what, err, lw.tailText())
	}
	return nil
}

// inRoot runs args as root of rootfs.
func (b *box) inRoot(ctx context.Context, what, rootfs string, stdin io.Reader, args ...string) error {
	return b.exec(ctx, what, b.job(rootfs, stdin, nil, args...))
}

// inRootOutput is inRoot that returns the command's standard output.
func (b *box) inRootOutput(ctx context.Context, what, rootfs string, args ...string) (string, error) {
	var out bytes.Buffer
	err := b.exec(ctx, what, b.job(rootfs, nil, &limitedBuffer{b: &out, max: 16 << 20}, args...))
	return out.String(), err
}

// limitedBuffer keeps the first max bytes written to it and fails past
// them: a command's output is read into memory only up to a bound.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (w *limitedBuffer) Write(p []byte) (int, error) {
	if w.b.Len()+len(p) > w.max {
		return 0, fmt.Errorf("more than %d bytes of output", w.max)
	}
	return w.b.Write(p)
}

// lineWriter copies command output to progress, indented, a line at a
// time, and remembers the last tailLines lines.
type lineWriter struct {
	p    *progress
	buf  []byte
	skip bool // the rest of a line cut at maxLine
	tail []string
	// noSpace, if not nil, is called once when a line says "No space
	// left on device" (strerror(ENOSPC); builds run with LC_ALL=C).
	noSpace func()
}

const tailLines = 15

// maxLine is the longest line a build log keeps; the rest of a longer
// one is dropped, so that no command's output is held whole in memory.
const maxLine = 4096

func (w *lineWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexAny(w.buf, "\r\n")
		if i < 0 {
			if len(w.buf) > maxLine {
				w.line(string(w.buf[:maxLine]) + " [...]")
				w.buf = w.buf[:0]
				w.skip = true
			}
			break
		}
		if !w.skip {
			w.line(string(w.buf[:min(i, maxLine)]))
		}
		w.skip = false
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
	if w.noSpace != nil && strings.Contains(s, "No space left on device") {
		w.noSpace()
		w.noSpace = nil
	}
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
