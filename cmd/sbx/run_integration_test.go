//go:build integration

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/testenv"
)

// sbxBin builds sbx with the executor beside it, as `make build` does.
func sbxBin(t *testing.T) (bin string, env []string) {
	t.Helper()
	e := testenv.New(t)
	dir := t.TempDir()
	bin = filepath.Join(dir, "sbx")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build sbx: %v: %s", err, out)
	}
	exe, err := os.ReadFile(e.Executor)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sbx-executor"), exe, 0o755); err != nil {
		t.Fatal(err)
	}
	env = append(os.Environ(),
		"SBX_STATE_DIR="+filepath.Join(e.StateRoot, "cli"),
		"SBX_DATA_DIR="+filepath.Dir(testenv.TemplateDir()))
	return bin, env
}

type cliResult struct {
	Status      string          `json:"status"`
	ExitCode    int             `json:"exit_code"`
	Stdout      string          `json:"stdout"`
	Stderr      string          `json:"stderr"`
	ReturnValue json.RawMessage `json:"return_value"`
	Artifacts   []string        `json:"artifacts"`
	Error       *struct {
		Type, Message, Traceback string
	} `json:"error"`
}

func sbx(t *testing.T, bin string, env []string, stdin string, args ...string) (cliResult, int, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"run"}, args...)...)
	cmd.Env = env
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var r cliResult
	if out.Len() > 0 {
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("output is not one JSON object: %v: %s", err, out.String())
		}
		// The CLI indents its output; compare return values compactly.
		var b bytes.Buffer
		if len(r.ReturnValue) > 0 && json.Compact(&b, r.ReturnValue) == nil {
			r.ReturnValue = b.Bytes()
		}
	}
	return r, code, errb.String()
}

func TestRun(t *testing.T) {
	bin, env := sbxBin(t)
	for _, tc := range []struct {
		name   string
		args   []string
		stdin  string
		code   int
		status string
		check  func(t *testing.T, r cliResult, stderr string)
	}{
		{"print and return", []string{"-c", "print('hi')\nreturn {'n': 6*7}"}, "", 0, "completed", func(t *testing.T, r cliResult, _ string) {
			if r.Stdout != "hi\n" || string(r.ReturnValue) != `{"n":42}` {
				t.Errorf("stdout %q return %s", r.Stdout, r.ReturnValue)
			}
		}},
		{"handler", []string{"--event", `{"x": [1,2,3]}`, "-c", "def handler(event):\n    return sum(event['x'])"}, "", 0, "completed", func(t *testing.T, r cliResult, _ string) {
			if string(r.ReturnValue) != "6" {
				t.Errorf("return %s", r.ReturnValue)
			}
		}},
		{"exception", []string{"-c", "x = 1\n1/0"}, "", 1, "failed", func(t *testing.T, r cliResult, _ string) {
			if r.Error == nil || r.Error.Type != "ZeroDivisionError" || !strings.Contains(r.Error.Traceback, "line 2") {
				t.Errorf("error %+v", r.Error)
			}
		}},
		{"bash exit code", []string{"--language", "bash", "-c", "echo out; echo err >&2; exit 3"}, "", 1, "failed", func(t *testing.T, r cliResult, _ string) {
			if r.ExitCode != 3 || r.Stdout != "out\n" || r.Stderr != "err\n" {
				t.Errorf("%+v", r)
			}
		}},
		{"timeout", []string{"--timeout", "1s", "--language", "bash", "-c", "sleep 60"}, "", 1, "timeout", nil},
		{"code from stdin", []string{"-f", "-"}, "return 'from stdin'", 0, "completed", func(t *testing.T, r cliResult, _ string) {
			if string(r.ReturnValue) != `"from stdin"` {
				t.Errorf("return %s", r.ReturnValue)
			}
		}},
		{"artifacts", []string{"-c", "open('/workspace/out.txt','w').write('x')"}, "", 0, "completed", func(t *testing.T, r cliResult, _ string) {
			if len(r.Artifacts) != 1 || r.Artifacts[0] != "out.txt" {
				t.Errorf("artifacts %v", r.Artifacts)
			}
		}},
		{"env", []string{"--env", "GREETING=hello", "--language", "bash", "-c", "echo $GREETING"}, "", 0, "completed", func(t *testing.T, r cliResult, _ string) {
			if r.Stdout != "hello\n" {
				t.Errorf("stdout %q", r.Stdout)
			}
		}},
		{"no code", nil, "", 2, "", nil},
		{"bad event", []string{"--event", "{", "-c", "pass"}, "", 2, "", nil},
		{"unknown template", []string{"--template", "no-such-template", "-c", "pass"}, "", 2, "", nil},
		{"bad memory", []string{"--memory", "lots", "-c", "pass"}, "", 2, "", nil},
		{"bad language", []string{"--language", "cobol", "-c", "pass"}, "", 2, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, code, stderr := sbx(t, bin, env, tc.stdin, tc.args...)
			if code != tc.code || r.Status != tc.status {
				t.Fatalf("exit %d status %q, want %d %q; stderr: %s; result %+v", code, r.Status, tc.code, tc.status, stderr, r)
			}
			if tc.check != nil {
				tc.check(t, r, stderr)
			}
		})
	}
}

// TestDataAnalysis is the PTC workload across two templates sharing one
// workspace: pandas and matplotlib make a CSV, a chart and a PDF report, then
// the file-parser template reads the PDF back.
func TestDataAnalysis(t *testing.T) {
	bin, env := sbxBin(t)
	testenv.New(t).Rootfs(t, "python-datascience")
	testenv.New(t).Rootfs(t, "file-parser")
	ws, err := os.MkdirTemp(testenv.New(t).WorkspaceRoot, "ws-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(ws)

	r, code, stderr := sbx(t, bin, env, "", "--template", "python-datascience", "--workspace", ws, "-c", `
import pandas as pd, numpy as np
import matplotlib.pyplot as plt
df = pd.DataFrame({'x': np.arange(100), 'y': np.arange(100) ** 2})
df.to_csv('/workspace/data_clean.csv', index=False)
fig, ax = plt.subplots()
ax.plot(df.x, df.y)
ax.set_title('Quarterly revenue')
fig.savefig('/workspace/chart.png')
fig.savefig('/workspace/report.pdf')
return {'rows': len(df), 'mean_y': df.y.mean()}`)
	if code != 0 {
		t.Fatalf("datascience: exit %d: %s %+v", code, stderr, r)
	}
	if string(r.ReturnValue) != `{"rows":100,"mean_y":3283.5}` {
		t.Errorf("return %s", r.ReturnValue)
	}
	if strings.Join(r.Artifacts, ",") != "chart.png,data_clean.csv,report.pdf" {
		t.Errorf("artifacts %v", r.Artifacts)
	}
	png, err := os.ReadFile(filepath.Join(ws, "chart.png"))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Errorf("chart.png: %v", err)
	}

	r, code, stderr = sbx(t, bin, env, "", "--template", "file-parser", "--workspace", ws, "-c", `
from pypdf import PdfReader
import pandas as pd
text = PdfReader('/workspace/report.pdf').pages[0].extract_text()
return {'title': 'Quarterly revenue' in text, 'rows': len(pd.read_csv('/workspace/data_clean.csv'))}`)
	if code != 0 || string(r.ReturnValue) != `{"title":true,"rows":100}` {
		t.Fatalf("file-parser: exit %d: %s %+v", code, stderr, r)
	}
	r, code, _ = sbx(t, bin, env, "", "--template", "file-parser", "--workspace", ws, "--language", "bash", "-c", "pdftotext /workspace/report.pdf - | grep -c Quarterly")
	if code != 0 || r.Stdout != "1\n" {
		t.Errorf("pdftotext: %+v", r)
	}
}
