package executor

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// TestPython covers the semantics of Python executions.
func TestPython(t *testing.T) {
	env := sharedEnv(t)
	tests := []struct {
		name   string
		code   string
		event  string
		status wire.Status
		exit   int
		ret    string // expected return_value JSON, "" for absent
		stdout string
		// errType, if set, is the expected error type; tbHas must be in
		// the traceback, tbNot must not.
		errType, errMsg, tbHas, tbNot string
	}{
		{name: "print", code: "print('hello')", status: wire.StatusCompleted, stdout: "hello\n"},
		{name: "handler gets the event", code: "def handler(event):\n    return {'got': event['x'] * 2}", event: `{"x": 21}`,
			status: wire.StatusCompleted, ret: `{"got":42}`},
		{name: "handler without event gets None", code: "def handler(event):\n    return event is None", status: wire.StatusCompleted, ret: `true`},
		{name: "handler returning None", code: "def handler(event):\n    pass", status: wire.StatusCompleted, ret: `null`},
		{name: "async handler", code: "import asyncio\nasync def handler(event):\n    await asyncio.sleep(0)\n    return event", event: `[1,2]`,
			status: wire.StatusCompleted, ret: `[1,2]`},
		{name: "top-level await", code: "import asyncio\nawait asyncio.sleep(0)\nreturn 5", status: wire.StatusCompleted, ret: `5`},
		{name: "top-level return", code: "x = 6\nreturn x * 7", status: wire.StatusCompleted, ret: `42`},
		{name: "bare return", code: "print('a')\nreturn\nprint('b')", status: wire.StatusCompleted, ret: `null`, stdout: "a\n"},
		{name: "return inside if", code: "if True:\n    return 'yes'\nreturn 'no'", status: wire.StatusCompleted, ret: `"yes"`},
		{name: "return inside for", code: "for i in range(10):\n    if i == 3:\n        return i\n", status: wire.StatusCompleted, ret: `3`},
		{name: "return inside while and with", code: "import contextlib\nwhile True:\n    with contextlib.nullcontext():\n        return 'w'", status: wire.StatusCompleted, ret: `"w"`},
		{name: "return in try runs finally", code: "try:\n    return 1\nfinally:\n    print('finally ran')", status: wire.StatusCompleted, ret: `1`, stdout: "finally ran\n"},
		{name: "return is not an Exception", code: "try:\n    return 'kept'\nexcept Exception:\n    return 'caught'", status: wire.StatusCompleted, ret: `"kept"`},
		{name: "return wins over handler", code: "def handler(event):\n    return 'handler'\nreturn 'top'", status: wire.StatusCompleted, ret: `"top"`},
		{name: "returns inside functions untouched", code: "def f():\n    return 1\nclass C:\n    def m(self):\n        return 2\ng = lambda: 3\nreturn [f(), C().m(), g()]", status: wire.StatusCompleted, ret: `[1,2,3]`},
		{name: "module globals stay globals", code: "x = 1\ndef f():\n    return x + 1\nreturn f()", status: wire.StatusCompleted, ret: `2`},
		{name: "__name__ is __main__", code: "return __name__", status: wire.StatusCompleted, ret: `"__main__"`},
		{name: "no return value", code: "x = 1", status: wire.StatusCompleted},
		{name: "json conversions", code: `import datetime, decimal
class P:
    def __repr__(self): return 'P()'
return {'t': (1, 2), 's': {3}, 'd': datetime.date(2024, 1, 2), 'dt': datetime.datetime(2024, 1, 2, 3, 4, 5),
        'dec': decimal.Decimal('1.5'), 'deci': decimal.Decimal('7'), 'b': b'hi', 'bb': b'\xff',
        'nan': float('nan'), 'inf': float('inf'), 1: 'int key', None: 'none key', 'obj': P()}`,
			status: wire.StatusCompleted,
			ret:    `{"t":[1,2],"s":[3],"d":"2024-01-02","dt":"2024-01-02T03:04:05","dec":1.5,"deci":7,"b":"hi","bb":"b'\\xff'","nan":null,"inf":null,"1":"int key","null":"none key","obj":"P()"}`},
		{name: "repr fallback", code: "class Thing:\n    def __repr__(self):\n        return '<thing>'\nreturn Thing()", status: wire.StatusCompleted, ret: `"<thing>"`},
		{name: "cyclic value", code: "a = []\na.append(a)\nreturn len(str(a)) > 0", status: wire.StatusCompleted, ret: `true`},
		{name: "exception", code: "x = 1\n\ndef f():\n    raise ValueError('bad value')\nf()", status: wire.StatusFailed, exit: 1,
			errType: "ValueError", errMsg: "bad value", tbHas: "File \"<code>\", line 5, in <module>\n    f()", tbNot: "zygote"},
		{name: "exception in handler", code: "def handler(event):\n    return 1 / 0", status: wire.StatusFailed, exit: 1,
			errType: "ZeroDivisionError", tbHas: "in handler\n    return 1 / 0", tbNot: "zygote"},
		{name: "traceback starts at user code", code: "import json\njson.loads('{')", status: wire.StatusFailed, exit: 1,
			errType: "JSONDecodeError", tbHas: "Traceback (most recent call last):\n  File \"<code>\", line 2, in <module>", tbNot: "runner"},
		{name: "syntax error", code: "x = 1\ny = (\n", status: wire.StatusFailed, exit: 1, errType: "SyntaxError", tbHas: "line 2"},
		{name: "return outside function in class is a syntax error", code: "class C:\n    return 1", status: wire.StatusFailed, exit: 1, errType: "SyntaxError"},
		{name: "sys.exit(0)", code: "import sys\nprint('bye')\nsys.exit(0)", status: wire.StatusCompleted, stdout: "bye\n"},
		{name: "sys.exit()", code: "import sys\nsys.exit()", status: wire.StatusCompleted},
		{name: "sys.exit(3)", code: "import sys\nsys.exit(3)", status: wire.StatusFailed, exit: 3, errType: "SystemExit", errMsg: "3"},
		{name: "sys.exit(message)", code: "import sys\nsys.exit('giving up')", status: wire.StatusFailed, exit: 1, errType: "SystemExit", errMsg: "giving up"},
		{name: "os._exit without result", code: "import os\nos._exit(4)", status: wire.StatusFailed, exit: 4, errType: wire.ErrTypeNonZeroExit},
		{name: "killed by a signal", code: "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", status: wire.StatusCompleted},
		{name: "segfault", code: "import ctypes\nctypes.string_at(0)", status: wire.StatusFailed, exit: 139, errType: wire.ErrTypeSignal},
		{name: "non-daemon thread finishes", code: "import threading, time\ndef w():\n    time.sleep(0.05)\n    print('thread done')\nthreading.Thread(target=w).start()", status: wire.StatusCompleted, stdout: "thread done\n"},
		{name: "env and cwd", code: "import os\nreturn [os.environ['SBX_BASE'], os.environ['ONLY_HERE'], os.getcwd() == os.path.realpath('.')]", status: wire.StatusCompleted, ret: `["base","here",true]`},
		{name: "imports modules beside it", code: "open('helper_mod.py', 'w').write('V = 9\\n')\nimport helper_mod\nreturn helper_mod.V", status: wire.StatusCompleted, ret: `9`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := py(tc.code)
			if tc.event != "" {
				req.Event = json.RawMessage(tc.event)
			}
			req.Env = map[string]string{"ONLY_HERE": "here"}
			res := env.run(t, req)
			if tc.name == "killed by a signal" {
				// PID 1 of a namespace cannot be killed from inside it: the
				// signal is ignored and the code goes on.
				if res.Status != wire.StatusCompleted {
					t.Errorf("status %s, error %+v", res.Status, res.Error)
				}
				return
			}
			if res.Status != tc.status || res.ExitCode != tc.exit {
				t.Fatalf("status %s exit %d, want %s %d; error %+v; stderr %q", res.Status, res.ExitCode, tc.status, tc.exit, res.Error, res.Stderr)
			}
			if got := string(res.ReturnValue); got != tc.ret {
				t.Errorf("return_value %s, want %s", got, tc.ret)
			}
			if tc.stdout != "" && res.Stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tc.stdout)
			}
			if tc.errType == "" {
				if res.Error != nil {
					t.Errorf("unexpected error %+v", res.Error)
				}
				return
			}
			if res.Error == nil {
				t.Fatalf("no error, want %s", tc.errType)
			}
			if res.Error.Type != tc.errType {
				t.Errorf("error type %q, want %q (%+v)", res.Error.Type, tc.errType, res.Error)
			}
			if tc.errMsg != "" && res.Error.Message != tc.errMsg {
				t.Errorf("error message %q, want %q", res.Error.Message, tc.errMsg)
			}
			if tc.tbHas != "" && !strings.Contains(res.Error.Traceback, tc.tbHas) {
				t.Errorf("traceback lacks %q:\n%s", tc.tbHas, res.Error.Traceback)
			}
			if tc.tbNot != "" && strings.Contains(res.Error.Traceback, tc.tbNot) {
				t.Errorf("traceback shows %q:\n%s", tc.tbNot, res.Error.Traceback)
			}
		})
	}
}

// TestPythonScientificValues converts numpy and pandas values, when the
// host has them (Debian: python3-numpy, python3-pandas).
func TestPythonScientificValues(t *testing.T) {
	env := sharedEnv(t)
	for _, mod := range []string{"numpy", "pandas"} {
		if exec.Command(testPython, "-c", "import "+mod).Run() != nil {
			t.Skipf("%s is not installed for %s", mod, testPython)
		}
	}
	tests := []struct{ name, code, ret string }{
		{"numpy scalars", "import numpy as np\nreturn [np.int64(3), np.float32(1.5), np.bool_(True), np.float64('nan')]", `[3,1.5,true,null]`},
		{"numpy array", "import numpy as np\nreturn np.arange(6).reshape(2, 3)", `[[0,1,2],[3,4,5]]`},
		{"pandas frame", "import pandas as pd\nreturn pd.DataFrame({'a': [1, 2], 'b': ['x', None]})", `[{"a":1,"b":"x"},{"a":2,"b":null}]`},
		{"pandas series", "import pandas as pd\nreturn pd.Series([1.5, 2.5])", `[1.5,2.5]`},
		{"pandas timestamp", "import pandas as pd\nreturn {'t': pd.Timestamp('2024-01-02 03:04:05'), 'nat': pd.NaT}", `{"t":"2024-01-02T03:04:05","nat":null}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := env.run(t, py(tc.code))
			if res.Status != wire.StatusCompleted || string(res.ReturnValue) != tc.ret {
				t.Errorf("status %s return %s, want %s; error %+v", res.Status, res.ReturnValue, tc.ret, res.Error)
			}
		})
	}
}

func TestBash(t *testing.T) {
	env := sharedEnv(t)
	tests := []struct {
		name, code     string
		status         wire.Status
		exit           int
		stdout, stderr string
		errType        string
	}{
		{name: "echo", code: "echo hi", status: wire.StatusCompleted, stdout: "hi\n"},
		{name: "stderr", code: "echo oops >&2", status: wire.StatusCompleted, stderr: "oops\n"},
		{name: "exit 3", code: "echo before; exit 3", status: wire.StatusFailed, exit: 3, stdout: "before\n", errType: wire.ErrTypeNonZeroExit},
		{name: "false", code: "false", status: wire.StatusFailed, exit: 1, errType: wire.ErrTypeNonZeroExit},
		{name: "command not found", code: "no-such-command-sbx", status: wire.StatusFailed, exit: 127, errType: wire.ErrTypeNonZeroExit},
		{name: "env", code: `echo "$SBX_BASE $ONLY_HERE"`, status: wire.StatusCompleted, stdout: "base here\n"},
		{name: "pid 1 of its namespace", code: `echo $$`, status: wire.StatusCompleted, stdout: "1\n"},
		{name: "sigpipe is default again", code: `yes | head -1`, status: wire.StatusCompleted, stdout: "y\n"},
		{name: "child killed by signal", code: `sh -c 'kill -SEGV $$'; exit $?`, status: wire.StatusFailed, exit: 139, errType: wire.ErrTypeNonZeroExit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := sh(tc.code)
			req.Env = map[string]string{"ONLY_HERE": "here"}
			res := env.run(t, req)
			if res.Status != tc.status || res.ExitCode != tc.exit {
				t.Fatalf("status %s exit %d, want %s %d; error %+v; stderr %q", res.Status, res.ExitCode, tc.status, tc.exit, res.Error, res.Stderr)
			}
			if tc.stdout != "" && res.Stdout != tc.stdout {
				t.Errorf("stdout %q, want %q", res.Stdout, tc.stdout)
			}
			if tc.stderr != "" && res.Stderr != tc.stderr {
				t.Errorf("stderr %q, want %q", res.Stderr, tc.stderr)
			}
			if tc.errType != "" && (res.Error == nil || res.Error.Type != tc.errType) {
				t.Errorf("error %+v, want type %s", res.Error, tc.errType)
			}
			if tc.errType == "" && res.Error != nil {
				t.Errorf("unexpected error %+v", res.Error)
			}
			if res.ReturnValue != nil {
				t.Errorf("bash returned %s", res.ReturnValue)
			}
		})
	}
}

func TestCwd(t *testing.T) {
	env := sharedEnv(t)
	req := sh("pwd")
	req.Cwd = "/tmp"
	if res := env.run(t, req); res.Stdout != "/tmp\n" {
		t.Errorf("cwd /tmp: %q %+v", res.Stdout, res.Error)
	}
	req.Cwd = "/no/such/dir"
	res := env.run(t, req)
	if res.Status != wire.StatusFailed || res.Error == nil || res.Error.Type != "FileNotFoundError" {
		t.Errorf("missing cwd: %s %+v", res.Status, res.Error)
	}
	if res := env.run(t, py("import os\nreturn os.getcwd()")); string(res.ReturnValue) != `"`+env.ws+`"` {
		t.Errorf("default cwd %s, want the workspace %s", res.ReturnValue, env.ws)
	}
}
