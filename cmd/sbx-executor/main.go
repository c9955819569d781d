// Command sbx-executor is the daemon inside every sandbox: PID 1 of the
// container, serving the executor protocol (internal/executor/PROTOCOL.md)
// on a unix socket, or with --listen on a TCP address (a pod's IP), where
// it accepts only connections that open with the control plane's token. It must be built static (CGO_ENABLED=0): it is
// bind-mounted into rootfs images that may have no matching libc.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	goruntime "runtime"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/internal/executor"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
	"github.com/sbx-sandbox/sbx/internal/seccomp"
)

// version is set by the build (-ldflags "-X main.version=...").
var version string

func main() {
	// The zygote's shim and the holder of its namespaces are this binary
	// re-executed (internal/executor/shim.go).
	executor.RunHelper()
	// One P unless told otherwise: the executor only shuttles bytes between
	// sockets and pipes, and with a second P the Go scheduler wakes another
	// thread for most goroutines it readies. A thread switch is expensive
	// under paravirtualized page tables: one P halves the executor's context
	// switches per execution and shortens a round trip by a few hundred
	// microseconds.
	if os.Getenv("GOMAXPROCS") == "" {
		goruntime.GOMAXPROCS(1)
	}
	if version != "" {
		executor.Version = version
	}
	if err := run(); err != nil {
		fmt.Fprintln(lastWords, "sbx-executor:", err)
		os.Exit(1)
	}
}

// lastWords is where a failed start says why: stderr as the process got it
// (runc's log of the sandbox), also after --log-file took stderr over.
var lastWords = os.Stderr

func run() error {
	var (
		cfg      executor.Config
		preload  string
		envFile  string
		logLevel string
		logFile  string
		logMax   int64
		listen   string
		pubKey   string
		sandbox  string
	)
	flag.StringVar(&cfg.SocketPath, "socket", "/run/sbx/executor.sock", "unix socket to serve the API on; its directory becomes root-only")
	flag.StringVar(&cfg.Workspace, "workspace", "/workspace", "the session's files; default cwd of executions")
	flag.IntVar(&cfg.UID, "uid", 1000, "user id user code runs as (not 0)")
	flag.IntVar(&cfg.GID, "gid", 1000, "group id user code runs as (not 0)")
	flag.StringVar(&preload, "preload", "", "comma-separated Python modules to import before the first execution")
	flag.StringVar(&cfg.Python, "python", "/usr/bin/python3", "Python interpreter of the zygote")
	flag.StringVar(&envFile, "env-file", "", "JSON object of variables for user code only (template and session env_vars); never this process's or the zygote's environment")
	flag.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	flag.StringVar(&logFile, "log-file", "", "write the log, and what the zygote writes to stderr, to this file instead of stderr, rotated at --log-max-bytes")
	flag.BoolVar(&cfg.Unprivileged, "unprivileged", false, "run without CAP_SYS_ADMIN or namespaces of our own, as in a Kubernetes Pod (internal/executor/unprivileged.go; docs/SECURITY.md, \"In a Pod\")")
	flag.Int64Var(&logMax, "log-max-bytes", 256<<10, "size at which --log-file is rotated (one older file is kept)")
	flag.StringVar(&listen, "listen", "", "TCP address to serve the API on instead of --socket; every connection must carry a token of the control plane (needs --auth-public-key and --sandbox-id)")
	flag.StringVar(&pubKey, "auth-public-key", "", "base64 ed25519 public key the control plane's tokens verify with (default $"+envPublicKey+")")
	flag.StringVar(&sandbox, "sandbox-id", "", "this sandbox's id: tokens for another are refused (default $"+envSandboxID+")")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if cfg.UID == 0 || cfg.GID == 0 {
		return fmt.Errorf("--uid and --gid must not be 0: user code never runs as root")
	}
	for _, m := range strings.Split(preload, ",") {
		if m = strings.TrimSpace(m); m != "" {
			cfg.Preload = append(cfg.Preload, m)
		}
	}
	if envFile != "" {
		env, err := readEnvFile(envFile)
		if err != nil {
			return err
		}
		cfg.UserEnv = env
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if logFile != "" {
		// runc's stdout and stderr of a sandbox go to a file of the host
		// that nothing bounds, and the zygote's stderr is the template's
		// code's to write: both go to a rotating file instead.
		lf, err := executor.OpenRotating(logFile, logMax)
		if err != nil {
			return fmt.Errorf("--log-file: %w", err)
		}
		orig, err := executor.RedirectOutput(lf)
		if err != nil {
			return fmt.Errorf("--log-file: %w", err)
		}
		lastWords = orig
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	innerFilter := seccomp.InnerFilter
	if cfg.Unprivileged {
		innerFilter = seccomp.UnprivilegedInnerFilter
	}
	filter, err := innerFilter()
	if err != nil {
		return fmt.Errorf("inner seccomp filter: %w", err)
	}
	cfg.SeccompFilter = filter
	if err := narrowCapabilities(); err != nil {
		return err
	}

	cfg.Auth, err = networkAuth(listen, pubKey, sandbox, os.Getenv)
	if err != nil {
		return err
	}
	if listen != "" {
		if cfg.Listener, err = net.Listen("tcp", listen); err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
	}
	srv, err := executor.New(cfg)
	if err != nil {
		return err
	}
	// As PID 1 a signal without a handler is ignored: SIGTERM must be
	// handled explicitly for `runc kill` (and a pod's termination) to work.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return srv.Serve(ctx)
}

const (
	envPublicKey = "SBX_EXECUTOR_PUBLIC_KEY"
	envSandboxID = "SBX_SANDBOX_ID"
)

// networkAuth is the token check of a TCP listener, from the flags or
// the environment. A TCP listener without one is refused (never an
// anonymous API on a network), and so is a key or id given without
// --listen: half a configuration is a mistake to report, not to guess at.
func networkAuth(listen, pubKey, sandbox string, getenv func(string) string) (*token.Verifier, error) {
	if pubKey == "" {
		pubKey = getenv(envPublicKey)
	}
	if sandbox == "" {
		sandbox = getenv(envSandboxID)
	}
	if listen == "" {
		if pubKey != "" || sandbox != "" {
			return nil, fmt.Errorf("--auth-public-key and --sandbox-id ($%s, $%s) are for --listen, which is not set", envPublicKey, envSandboxID)
		}
		return nil, nil
	}
	if pubKey == "" || sandbox == "" {
		return nil, fmt.Errorf("--listen needs --auth-public-key ($%s) and --sandbox-id ($%s): an executor on a network accepts only the control plane", envPublicKey, envSandboxID)
	}
	key, err := token.ParsePublicKey(pubKey)
	if err != nil {
		return nil, fmt.Errorf("--auth-public-key: %w", err)
	}
	v, err := token.NewVerifier(key, sandbox)
	if err != nil {
		return nil, fmt.Errorf("--sandbox-id: %w", err)
	}
	return v, nil
}

// readEnvFile reads the variables user code gets. They come from the
// tenant (session env_vars) and the template, so they never enter this
// process's environment: the zygote, which runs as the sandbox's root,
// inherits that, and a tenant's LD_PRELOAD there would run the tenant's
// library with the executor's capabilities.
func readEnvFile(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--env-file: %w", err)
	}
	var env map[string]string
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, fmt.Errorf("--env-file %s: %w", path, err)
	}
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("--env-file %s: bad variable %q", path, k)
		}
	}
	return env, nil
}

// ownCaps are the capabilities this process uses itself: to signal user
// code, which runs as another uid (CAP_KILL, 5), and to list a workspace
// whatever modes user code gave its directories (CAP_DAC_READ_SEARCH, 2).
const ownCaps = 1<<unix.CAP_KILL | 1<<unix.CAP_DAC_READ_SEARCH

// narrowCapabilities leaves only ownCaps effective, in every thread. The
// rest stay permitted: CHOWN, DAC_OVERRIDE and FOWNER for the file
// routes, which make them effective on their own thread for a call
// (internal/executor/filecaps.go); the others for the zygote alone: it is exec'd as root, under
// no_new_privs, so it gets the permitted set and no more, and it needs it
// to give each execution its own namespaces and to drop to the sandbox
// user. What this process does with paths a sandbox controls (the
// workspace, the control directory) runs without them.
func narrowCapabilities() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Effective &= ownCaps
	data[1].Effective = 0
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); errno != 0 {
		return fmt.Errorf("capset: %w", errno)
	}
	return nil
}
