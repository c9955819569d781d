package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
)

const sessionUsage = `usage: sbx session COMMAND [flags] [ARGS]

commands:
  create [flags]       create a session (or get the one of --id) and print it
      --id ID            the session's id (default: the server makes one)
      --template T       template (default: the server's, python)
      --timeout DUR      time to live, e.g. 24h (default: the server's, 24h)
      --idle-timeout DUR pause the sandbox after this long idle (default 10m)
      --hibernate-timeout DUR
                         hibernate the session after this long idle (default 24h)
      --warm-up          start the sandbox now, not at the first execution
      --memory SIZE      memory limit, e.g. 512M or 1G
      --cpu N            CPU cores, e.g. 0.5
      --disk SIZE        workspace quota, e.g. 1G
      --env K=V          environment variable (repeatable)
      --meta K=V         metadata, e.g. user_id=u1 (repeatable)
  get ID               print a session
  ls [flags]           list sessions
      --status S         only in this status (running, paused, ...)
      --user U           only of metadata user_id U
      --agent A          only of metadata agent_id A
  rm ID                delete a session: its sandbox and workspace go
  pause ID             freeze a session's sandbox
  resume ID            resume a paused or hibernated session (and warm a sandbox)
  hibernate ID         save the workspace to the blob store, destroy the sandbox
  snapshot create ID   snapshot the session's workspace
  snapshot ls ID       list its snapshots
  snapshot restore ID SNAPSHOT
                       replace its workspace with a snapshot's
  snapshot rm ID SNAPSHOT
                       delete a snapshot
  resources ID [DIR]   make the session's resources (read-only, at
                       /workspace/.resources) exactly DIR's files, sending
                       only what changed; without DIR, list them

Exit status: 0 on success, 1 if the server refused (no such session, say),
2 for a usage error, 3 if the server failed or could not be reached.
` + clientFlagsUsage

const clientFlagsUsage = `
flags (every command):
  --server URL    the sbx server (default $SBX_SERVER, else http://127.0.0.1:7070)
  --api-key KEY   its API key (default $SBX_API_KEY)
`

// runSession implements `sbx session`.
func runSession(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, sessionUsage)
		return 2
	}
	switch args[0] {
	case "create":
		return sessionCreate(ctx, args[1:], stdout, stderr)
	case "get":
		return sessionByID(ctx, "get", args[1:], stdout, stderr, (*client.Client).GetSession)
	case "ls", "list":
		return sessionList(ctx, args[1:], stdout, stderr)
	case "rm", "delete":
		return sessionRemove(ctx, args[1:], stdout, stderr)
	case "pause":
		return sessionByID(ctx, "pause", args[1:], stdout, stderr, (*client.Client).PauseSession)
	case "resume":
		return sessionByID(ctx, "resume", args[1:], stdout, stderr, (*client.Client).ResumeSession)
	case "hibernate":
		return sessionByID(ctx, "hibernate", args[1:], stdout, stderr, (*client.Client).HibernateSession)
	case "snapshot", "snapshots":
		return sessionSnapshot(ctx, args[1:], stdout, stderr)
	case "resources":
		return sessionResources(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, sessionUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "sbx session: unknown command %q\n\n%s", args[0], sessionUsage)
		return 2
	}
}

// clientFlags makes a flag set with --server and --api-key; connect makes
// the client once it is parsed.
func clientFlags(name, usage string, stderr io.Writer) (fs *flag.FlagSet, connect func() *client.Client) {
	fs = flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	// The defaults come from the environment when the flag is not given,
	// so that -h never prints the key.
	server := fs.String("server", "", "the sbx server's `URL`")
	key := fs.String("api-key", "", "API `key`")
	return fs, func() *client.Client {
		url := *server
		if url == "" {
			url = envOr("SBX_SERVER", "http://127.0.0.1:7070")
		}
		if !strings.Contains(url, "://") {
			url = "http://" + url
		}
		k := *key
		if k == "" {
			k = os.Getenv("SBX_API_KEY")
		}
		var opts []client.Option
		if k != "" {
			opts = append(opts, client.WithAPIKey(k))
		}
		return client.New(url, opts...)
	}
}

// failed reports err of command cmd and returns the exit status: 1 if the
// server refused the request, 2 if the client did (a malformed path, say),
// 3 if the server failed or could not be reached.
func failed(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "sbx %s: %v\n", cmd, err)
	var ae *client.APIError
	switch {
	case errors.As(err, &ae):
		if ae.StatusCode < 500 {
			return 1
		}
		return 3
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return 2
	}
	return 3
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// keyValues reads repeated K=V flags.
func keyValues(flagName string, kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want KEY=VALUE", flagName, kv)
		}
		m[k] = v
	}
	return m, nil
}

// seconds is a duration flag in whole seconds, rounded up.
func seconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

func sessionCreate(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("session create", sessionUsage, stderr)
	var (
		id          = fs.String("id", "", "session `id`")
		tmpl        = fs.String("template", "", "template `name`")
		timeout     = fs.Duration("timeout", 0, "time to live")
		idleTimeout = fs.Duration("idle-timeout", 0, "idle time before the sandbox is paused")
		hibTimeout  = fs.Duration("hibernate-timeout", 0, "idle time before the session is hibernated")
		warmUp      = fs.Bool("warm-up", false, "start the sandbox now")
		memory      = fs.String("memory", "", "memory limit, e.g. 512M")
		cpu         = fs.Float64("cpu", 0, "CPU cores")
		disk        = fs.String("disk", "", "workspace quota, e.g. 1G")
		env, meta   multiFlag
	)
	fs.Var(&env, "env", "`KEY=VALUE` environment variable (repeatable)")
	fs.Var(&meta, "meta", "`KEY=VALUE` metadata (repeatable)")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "sbx session create: unexpected argument %q (the id goes in --id)\n", pos[0])
		return 2
	}
	req := api.CreateSessionRequest{SessionID: *id, TemplateID: *tmpl, WarmUp: *warmUp}
	if *timeout < 0 || *idleTimeout < 0 || *hibTimeout < 0 || *cpu < 0 {
		fmt.Fprintln(stderr, "sbx session create: --timeout, --idle-timeout, --hibernate-timeout and --cpu must not be negative")
		return 2
	}
	req.Timeout, req.IdleTimeout, req.HibernateTimeout = seconds(*timeout), seconds(*idleTimeout), seconds(*hibTimeout)
	var res api.Resources
	res.CPU = *cpu
	for _, f := range []struct {
		name, v string
		dst     *int64
	}{{"memory", *memory, &res.Memory}, {"disk", *disk, &res.Disk}} {
		if f.v == "" {
			continue
		}
		if *f.dst, err = parseMemory(f.v); err != nil {
			fmt.Fprintf(stderr, "sbx session create: --%s: %v\n", f.name, err)
			return 2
		}
	}
	if res != (api.Resources{}) {
		req.Resources = &res
	}
	if req.EnvVars, err = keyValues("env", env); err == nil {
		req.Metadata, err = keyValues("meta", meta)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sbx session create:", err)
		return 2
	}
	s, created, err := connect().CreateSession(ctx, req)
	if err != nil {
		return failed(stderr, "session create", err)
	}
	if !created {
		fmt.Fprintf(stderr, "sbx session create: session %s exists already\n", s.SessionID)
	}
	printJSON(stdout, s)
	return 0
}

// sessionByID runs one call that takes a session id and prints the
// session.
func sessionByID(ctx context.Context, name string, args []string, stdout, stderr io.Writer,
	call func(*client.Client, context.Context, string) (*api.Session, error)) int {
	fs, connect := clientFlags("session "+name, sessionUsage, stderr)
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "sbx session %s: give one session ID\n", name)
		return 2
	}
	s, err := call(connect(), ctx, pos[0])
	if err != nil {
		return failed(stderr, "session "+name, err)
	}
	printJSON(stdout, s)
	return 0
}

// sessionSnapshot implements `sbx session snapshot create|ls|restore|rm`.
func sessionSnapshot(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, sessionUsage)
		return 2
	}
	verb := args[0]
	fs, connect := clientFlags("session snapshot "+verb, sessionUsage, stderr)
	pos, err := parseTemplateArgs(fs, args[1:])
	if err != nil {
		return 2
	}
	want := map[string]int{"create": 1, "ls": 1, "list": 1, "restore": 2, "rm": 2, "delete": 2}[verb]
	if want == 0 {
		fmt.Fprintf(stderr, "sbx session snapshot: unknown command %q (create, ls, restore, rm)\n", verb)
		return 2
	}
	if len(pos) != want {
		fmt.Fprintf(stderr, "sbx session snapshot %s: give %s\n", verb, map[int]string{1: "a session ID", 2: "a session ID and a snapshot ID"}[want])
		return 2
	}
	c := connect()
	var out any
	switch verb {
	case "create":
		out, err = c.CreateSnapshot(ctx, pos[0])
	case "ls", "list":
		out, err = c.ListSnapshots(ctx, pos[0])
	case "restore":
		out, err = c.RestoreSnapshot(ctx, pos[0], pos[1])
	case "rm", "delete":
		err = c.DeleteSnapshot(ctx, pos[0], pos[1])
	}
	if err != nil {
		return failed(stderr, "session snapshot "+verb, err)
	}
	if out != nil {
		printJSON(stdout, out)
	}
	return 0
}

func sessionRemove(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("session rm", sessionUsage, stderr)
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "sbx session rm: give one session ID")
		return 2
	}
	res, err := connect().DeleteSession(ctx, pos[0])
	if err != nil {
		return failed(stderr, "session rm", err)
	}
	fmt.Fprintln(stdout, res.SessionID, res.Status)
	return 0
}

func sessionList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("session ls", sessionUsage, stderr)
	opts := client.ListSessionsOptions{Limit: 1000}
	fs.StringVar(&opts.Status, "status", "", "only sessions in this `status`")
	fs.StringVar(&opts.UserID, "user", "", "only sessions of this `user_id`")
	fs.StringVar(&opts.AgentID, "agent", "", "only sessions of this `agent_id`")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "sbx session ls: unexpected argument %q\n", pos[0])
		return 2
	}
	c := connect()
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tTEMPLATE\tCREATED\tLAST ACTIVITY\tEXPIRES")
	for {
		page, err := c.ListSessions(ctx, opts)
		if err != nil {
			tw.Flush()
			return failed(stderr, "session ls", err)
		}
		for _, s := range page.Sessions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.SessionID, s.Status, s.TemplateID,
				localTime(s.CreatedAt), localTime(s.LastActivityAt), localTime(s.ExpiresAt))
		}
		if page.NextPageToken == "" {
			break
		}
		opts.PageToken = page.NextPageToken
	}
	tw.Flush()
	return 0
}

func localTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}
