// Command sbx is the sbx command line: it runs code in a sandbox, builds
// templates and serves the HTTP API.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `usage: sbx COMMAND [ARGS]

commands:
  serve      serve the HTTP API (sbx serve -h)
  run        run code in a fresh sandbox and print the result as JSON
  session    create, list and remove sessions of a server (sbx session -h)
  exec       run code in a session of a server (sbx exec -h)
  files      upload, list, download and remove a session's files (sbx files -h)
  mcp        serve a server's tools as an MCP server on stdio (sbx mcp -h)
  template   build, list and remove templates (sbx template -h)
  image      export templates and files as OCI images (sbx image -h)
  version    print the version

Global settings come from the environment:
  SBX_DATA_DIR   templates and workspaces (default /var/lib/sbx)
  SBX_STATE_DIR  sandbox bundles and runtime state (default /run/sbx)
`

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stdout, stderr)
	case "run":
		return runCode(ctx, args[1:], stdout, stderr)
	case "template":
		return runTemplate(ctx, args[1:], stdout, stderr)
	case "image":
		return runImage(ctx, args[1:], stdout, stderr)
	case "session":
		return runSession(ctx, args[1:], stdout, stderr)
	case "exec":
		return runExec(ctx, args[1:], stdout, stderr)
	case "files":
		return runFiles(ctx, args[1:], stdout, stderr)
	case "mcp":
		return runMCP(ctx, args[1:], os.Stdin, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "sbx", version)
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "sbx: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

// dataDir and stateDir are where sbx keeps its files; see usage.
func dataDir() string  { return envOr("SBX_DATA_DIR", "/var/lib/sbx") }
func stateDir() string { return envOr("SBX_STATE_DIR", "/run/sbx") }

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
