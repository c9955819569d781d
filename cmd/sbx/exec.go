package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/sbx-sandbox/sbx/api"
)

const execUsage = `usage: sbx exec SESSION (-c CODE | -f FILE) [flags]

Runs code in a session of an sbx server and prints the result as one JSON
object. With --stream, the code's stdout and stderr go to this command's
stdout and stderr as they happen, and a summary of the result (status,
exit code, return value, error) goes to stderr at the end.

Exit status: 0 if the execution completed, 1 if it failed, timed out or was
cancelled, 2 for a usage error, 3 if the server refused or failed the
request or could not be reached.

flags:
  -c CODE             the code to run
  -f FILE             read the code from FILE (- for standard input)
  --language L        python (default) or bash
  --stream            stream the output as it happens
  --conversation CID  run for this conversation (it sees its uploads)
  --context ID        run in this stateful python context
  --timeout DUR       execution timeout, e.g. 90s (default: the server's, 30s)
  --event JSON        passed to handler(event)
  --env K=V           environment variable (repeatable)
` + clientFlagsUsage

// runExec implements `sbx exec`.
func runExec(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, connect := clientFlags("exec", execUsage, stderr)
	var (
		code         = fs.String("c", "", "the `code` to run")
		file         = fs.String("f", "", "read the code from `file`")
		lang         = fs.String("language", "", "python or bash")
		stream       = fs.Bool("stream", false, "stream the output")
		conversation = fs.String("conversation", "", "conversation `id`")
		contextID    = fs.String("context", "", "stateful context `id`")
		timeout      = fs.Duration("timeout", 0, "execution timeout")
		event        = fs.String("event", "", "`JSON` passed to handler(event)")
		env          multiFlag
	)
	fs.Var(&env, "env", "`KEY=VALUE` (repeatable)")
	pos, err := parseTemplateArgs(fs, args)
	if err != nil {
		return 2
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "sbx exec: give one SESSION, not %q\n\n%s", pos, execUsage)
		return 2
	}
	src, err := readCode(*code, *file)
	if err != nil {
		fmt.Fprintln(stderr, "sbx exec:", err)
		return 2
	}
	switch *lang {
	case "", "python", "bash":
	default:
		fmt.Fprintf(stderr, "sbx exec: --language %q: want python or bash\n", *lang)
		return 2
	}
	if *timeout < 0 {
		fmt.Fprintln(stderr, "sbx exec: --timeout must not be negative")
		return 2
	}
	req := api.ExecuteRequest{
		Code: src, Language: *lang, Timeout: timeout.Seconds(),
		ConversationID: *conversation, ContextID: *contextID,
	}
	if *event != "" {
		if !json.Valid([]byte(*event)) {
			fmt.Fprintln(stderr, "sbx exec: --event is not valid JSON")
			return 2
		}
		req.Event = json.RawMessage(*event)
	}
	if req.EnvVars, err = keyValues("env", env); err != nil {
		fmt.Fprintln(stderr, "sbx exec:", err)
		return 2
	}

	c := connect()
	var x *api.Execution
	if *stream {
		x, err = c.ExecuteStream(ctx, pos[0], req, func(s, text string) {
			if s == api.EventStderr {
				io.WriteString(stderr, text)
			} else {
				io.WriteString(stdout, text)
			}
		})
	} else {
		x, err = c.Execute(ctx, pos[0], req)
	}
	if err != nil {
		fmt.Fprintln(stderr, "sbx exec:", err)
		return 3
	}
	if *stream {
		summarize(stderr, x)
	} else {
		printJSON(stdout, x)
	}
	if x.Status != api.ExecCompleted {
		return 1
	}
	return 0
}

// summarize writes what a streamed execution's output did not show.
func summarize(w io.Writer, x *api.Execution) {
	line := fmt.Sprintf("sbx: %s %s in %d ms", x.ExecutionID, x.Status, x.DurationMs)
	if x.ExitCode != nil {
		line += fmt.Sprintf(", exit code %d", *x.ExitCode)
	}
	if x.StdoutTruncated || x.StderrTruncated {
		line += ", output truncated"
	}
	fmt.Fprintln(w, line)
	if len(x.ReturnValue) > 0 && string(x.ReturnValue) != "null" {
		fmt.Fprintf(w, "return value: %s\n", x.ReturnValue)
	}
	if len(x.Artifacts) > 0 {
		fmt.Fprintf(w, "artifacts: %s\n", strings.Join(x.Artifacts, ", "))
	}
	if e := x.Error; e != nil {
		fmt.Fprintf(w, "error: %s: %s\n", e.Type, e.Message)
		if e.Traceback != "" {
			fmt.Fprint(w, strings.TrimRight(e.Traceback, "\n")+"\n")
		}
	}
}
