package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/api"
)

// executeAnswer is the fake server's execute: the code says what happens.
func executeAnswer(w http.ResponseWriter, r *http.Request, req api.ExecuteRequest) {
	code := 0
	x := api.Execution{
		ExecutionID: "exec-1", SessionID: r.PathValue("id"), Status: api.ExecCompleted, Language: "python",
		CreatedAt: testTime, DurationMs: 12, Stdout: "out\n", Stderr: "err\n", ExitCode: &code,
		ReturnValue: json.RawMessage(`{"n":1}`), Artifacts: []string{"chart.png"},
	}
	switch req.Code {
	case "unavailable":
		sendError(w, 503, "unavailable", "no sandbox can be had")
		return
	case "fail":
		code = 1
		x.Status, x.ReturnValue = api.ExecFailed, nil
		x.Error = &api.ExecError{Type: "ZeroDivisionError", Message: "division by zero", Traceback: "Traceback (most recent call last):\n  1/0\n"}
	}
	if r.Header.Get("Accept") != "text/event-stream" {
		sendJSON(w, 200, x)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(event string, v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b)
	}
	send("submitted", api.SubmitResponse{ExecutionID: "exec-1", Status: "submitted"})
	send("stdout", api.StreamOutput{Text: "out\n"})
	send("stderr", api.StreamOutput{Text: "err\n"})
	send("result", x)
}

func TestExec(t *testing.T) {
	f := newFakeAPI(t)
	codeFile := filepath.Join(t.TempDir(), "job.py")
	if err := os.WriteFile(codeFile, []byte("print('from a file')"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name           string
		args           []string
		code           int
		request        string
		stdout, stderr string
	}{
		{
			name: "wait for the result",
			args: []string{"exec", "s1", "-c", "print(1)", "--language", "python", "--timeout", "1m30s", "--event", `{"a": [1]}`,
				"--env", "K=V", "--conversation", "c1", "--context", "ctx1"},
			request: `POST /api/v1/sessions/s1/execute?wait=true {"code":"print(1)","language":"python","timeout":90,"event":{"a":[1]},` +
				`"env_vars":{"K":"V"},"conversation_id":"c1","context_id":"ctx1"}`,
			stdout: `"status": "completed"`,
		},
		{name: "code from a file", args: []string{"exec", "-f", codeFile, "s1"}, request: `POST /api/v1/sessions/s1/execute?wait=true {"code":"print('from a file')"}`},
		{name: "failed", args: []string{"exec", "s1", "-c", "fail"}, code: 1, stdout: `"type": "ZeroDivisionError"`},
		{name: "unavailable", args: []string{"exec", "s1", "-c", "unavailable"}, code: 3, stderr: "503 unavailable: no sandbox can be had"},
		{
			name: "stream", args: []string{"exec", "s1", "-c", "print(1)", "--stream"},
			request: `POST /api/v1/sessions/s1/execute {"code":"print(1)"}`,
			stdout:  "out\n",
			stderr:  "err\nsbx: exec-1 completed in 12 ms, exit code 0\nreturn value: {\"n\":1}\nartifacts: chart.png\n",
		},
		{
			name: "stream failed", args: []string{"exec", "s1", "-c", "fail", "--stream"}, code: 1,
			stderr: "error: ZeroDivisionError: division by zero\nTraceback (most recent call last):\n  1/0\n",
		},
		{name: "no session", args: []string{"exec", "-c", "1"}, code: 2},
		{name: "two sessions", args: []string{"exec", "s1", "s2", "-c", "1"}, code: 2},
		{name: "no code", args: []string{"exec", "s1"}, code: 2, stderr: "no code"},
		{name: "both -c and -f", args: []string{"exec", "s1", "-c", "1", "-f", codeFile}, code: 2},
		{name: "bad event", args: []string{"exec", "s1", "-c", "1", "--event", "{"}, code: 2, stderr: "--event"},
		{name: "bad language", args: []string{"exec", "s1", "-c", "1", "--language", "ruby"}, code: 2},
		{name: "bad env", args: []string{"exec", "s1", "-c", "1", "--env", "=1"}, code: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := f.last()
			code, stdout, stderr := f.sbx(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			if tt.request != "" && f.last() != tt.request {
				t.Errorf("request\n%s\nwant\n%s", f.last(), tt.request)
			}
			if tt.code == 2 && f.last() != before {
				t.Errorf("a usage error reached the server: %s", f.last())
			}
			if !strings.Contains(stdout, tt.stdout) || !strings.Contains(stderr, tt.stderr) {
				t.Errorf("stdout:\n%s\nstderr:\n%s\nwant %q and %q in them", stdout, stderr, tt.stdout, tt.stderr)
			}
		})
	}
}

// TestExecResultJSON: without --stream, stdout is exactly the result.
func TestExecResultJSON(t *testing.T) {
	f := newFakeAPI(t)
	code, stdout, _ := f.sbx("exec", "s1", "-c", "1")
	var x api.Execution
	if err := json.Unmarshal([]byte(stdout), &x); err != nil || code != 0 || x.Stdout != "out\n" || !strings.Contains(string(x.ReturnValue), `"n": 1`) {
		t.Errorf("exit %d, %v: %s", code, err, stdout)
	}
}
