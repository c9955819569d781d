package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	execclient "github.com/sbx-sandbox/sbx/internal/executor/client"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/runtime"
	"github.com/sbx-sandbox/sbx/internal/runtime/oci"
	"github.com/sbx-sandbox/sbx/internal/template"
)

const runUsage = `usage: sbx run [flags] (-c CODE | -f FILE)

Creates a sandbox from a template, runs the code in it, prints the result as
one JSON object and destroys the sandbox. Exit status: 0 if the execution
completed, 1 if it failed, timed out or was cancelled, 2 for a usage error,
3 if the sandbox could not be run.

flags:
`

// runCode implements `sbx run`.
func runCode(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, runUsage); fs.PrintDefaults() }
	var (
		tmplName = fs.String("template", "python", "template `name`")
		lang     = fs.String("language", "python", "python or bash")
		code     = fs.String("c", "", "the `code` to run")
		file     = fs.String("f", "", "read the code from `file` (- for standard input)")
		timeout  = fs.Duration("timeout", 0, "execution timeout (default: the template's, 30s)")
		memory   = fs.String("memory", "", "memory limit, e.g. 512M or 1G (default: the template's)")
		cpu      = fs.Float64("cpu", 0, "CPU cores (default: the template's)")
		event    = fs.String("event", "", "`JSON` passed to handler(event)")
		stream   = fs.Bool("stream", false, "copy output to stderr as it happens")
		rtName   = fs.String("runtime", "", "OCI runtime: runc, crun or runsc (default: the template's)")
		workdir  = fs.String("workspace", "", "use this host `dir` as /workspace and keep it; its files become the sandbox user's (host uid 101000) (default: a fresh tmpfs of the template's disk quota, removed afterwards)")
		disk     = fs.String("disk", "", "size of the throwaway workspace, e.g. 256M (default: the template's, 1G)")
		env      multiFlag
	)
	fs.Var(&env, "env", "`KEY=VALUE` set for the execution (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sbx run: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	src, err := readCode(*code, *file)
	if err != nil {
		fmt.Fprintln(stderr, "sbx run:", err)
		return 2
	}
	req := wire.RunRequest{ID: newID("exec"), Language: *lang, Code: src}
	if *event != "" {
		if !json.Valid([]byte(*event)) {
			fmt.Fprintln(stderr, "sbx run: --event is not valid JSON")
			return 2
		}
		req.Event = json.RawMessage(*event)
	}
	if len(env) > 0 {
		req.Env = map[string]string{}
		for _, kv := range env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				fmt.Fprintf(stderr, "sbx run: --env %q: want KEY=VALUE\n", kv)
				return 2
			}
			req.Env[k] = v
		}
	}
	spec, ok := template.Builtin(*tmplName)
	if !ok {
		var err error
		if spec, err = template.NewStore(filepath.Join(dataDir(), "templates")).Named(*tmplName); err != nil {
			fmt.Fprintf(stderr, "sbx run: template %q: %v\n", *tmplName, err)
			return 2
		}
	}
	res := spec.Resources
	if *memory != "" {
		mb, err := parseMemory(*memory)
		if err != nil {
			fmt.Fprintln(stderr, "sbx run: --memory:", err)
			return 2
		}
		res.MemoryMB = mb
	}
	if *disk != "" {
		mb, err := parseMemory(*disk)
		if err != nil {
			fmt.Fprintln(stderr, "sbx run: --disk:", err)
			return 2
		}
		res.DiskMB = mb
	}
	if *cpu < 0 || *timeout < 0 {
		fmt.Fprintln(stderr, "sbx run: --cpu and --timeout must not be negative")
		return 2
	}
	if *cpu > 0 {
		res.CPU = *cpu
	}
	req.TimeoutMs = time.Duration(spec.Timeout).Milliseconds()
	if *timeout > 0 {
		req.TimeoutMs = timeout.Milliseconds()
	}
	if req.TimeoutMs == 0 {
		req.TimeoutMs = 30000
	}
	if *rtName != "" {
		spec.Runtime = *rtName
	}
	if err := req.Validate(); err != nil {
		fmt.Fprintln(stderr, "sbx run:", err)
		return 2
	}

	result, err := runOnce(ctx, spec, res, *workdir, req, *stream, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "sbx run:", err)
		return 3
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	enc.Encode(result)
	if result.Status != wire.StatusCompleted {
		return 1
	}
	return 0
}

// runOnce builds (or finds) the template, runs one sandbox for req and
// destroys it again, whatever happens.
func runOnce(ctx context.Context, spec template.Spec, res runtime.Resources, workdir string, req wire.RunRequest, stream bool, stderr io.Writer) (*wire.Result, error) {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store := template.NewStore(filepath.Join(dataDir(), "templates"))
	store.Jobs = oci.NewJobRunner(oci.Config{StateDir: stateDir(), Log: log})
	tmpl, ok := store.Lookup(spec)
	if !ok {
		fmt.Fprintf(stderr, "sbx: building template %s (once; cached in %s)\n", spec.Name, store.Dir)
		var err error
		if tmpl, err = store.Ensure(ctx, spec, stderr); err != nil {
			return nil, err
		}
	}
	// The image is the store's build; the one volume is the working
	// directory, named to the runtime as "workdir" and nothing else.
	volumes := &oci.Dirs{}
	rt, err := oci.New(oci.Config{Runtime: spec.Runtime, StateDir: stateDir(), Log: log, Images: store, Volumes: volumes})
	if err != nil {
		return nil, err
	}
	if workdir == "" {
		dir := filepath.Join(dataDir(), "run")
		if err := os.MkdirAll(dir, 0o711); err != nil {
			return nil, err
		}
		if workdir, err = os.MkdirTemp(dir, "ws-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(workdir)
		// A throwaway workspace is a tmpfs of the disk quota's size: a
		// disk filler hits ENOSPC (or, since tmpfs pages are charged to the
		// writer's memory cgroup, the memory limit) instead of the host's
		// disk, and nothing is left behind.
		quota := fmt.Sprintf("size=%dm,mode=0755", res.WithDefaults().DiskMB)
		if err := syscall.Mount("tmpfs", workdir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, quota); err != nil {
			return nil, fmt.Errorf("workspace: %w", err)
		}
		defer syscall.Unmount(workdir, syscall.MNT_DETACH)
	}
	volumes.Add("workdir", workdir)
	id := newID("run")
	// Cleanup must happen even when ctx was cancelled by Ctrl-C.
	defer rt.Destroy(context.WithoutCancel(ctx), id)
	if _, err := rt.Create(ctx, runtime.Spec{
		ID: id, Image: tmpl.Image(), Volume: "workdir", Env: spec.Env,
		Preload: spec.Preload, Resources: res,
		Labels: map[string]string{"sbx.template": spec.Name, "sbx.command": "run"},
	}); err != nil {
		return nil, err
	}
	client := execclient.NewClient(func(ctx context.Context) (net.Conn, error) { return rt.Dial(ctx, id) })
	defer client.Close()
	var onOutput func(stream, data string)
	if stream {
		onOutput = func(_, data string) { io.WriteString(stderr, data) }
	}
	return client.Run(ctx, req, onOutput)
}

func readCode(code, file string) (string, error) {
	switch {
	case code != "" && file != "":
		return "", errors.New("give -c or -f, not both")
	case code != "":
		return code, nil
	case file == "-":
		b, err := io.ReadAll(io.LimitReader(os.Stdin, wire.MaxCodeBytes+1))
		return string(b), err
	case file != "":
		b, err := os.ReadFile(file)
		return string(b), err
	default:
		return "", errors.New("no code: give -c CODE or -f FILE")
	}
}

// parseMemory reads sizes like 512M, 512MiB, 1G, 1.5GB or a plain number
// of MiB.
func parseMemory(s string) (int64, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B"), "I")
	mult := 1.0
	switch {
	case strings.HasSuffix(t, "K"):
		mult, t = 1.0/1024, strings.TrimSuffix(t, "K")
	case strings.HasSuffix(t, "M"):
		t = strings.TrimSuffix(t, "M")
	case strings.HasSuffix(t, "G"):
		mult, t = 1024, strings.TrimSuffix(t, "G")
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a size like 512M or 1G", s)
	}
	mb := int64(v * mult)
	if mb < 16 || mb > 1<<20 {
		return 0, fmt.Errorf("%q: want between 16M and 1T", s)
	}
	return mb, nil
}

func newID(prefix string) string {
	b := make([]byte, 8)
	rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
