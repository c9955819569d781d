package execution

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sbx-sandbox/sbx/api"
)

// checkCut holds cutJSON to its word: a start of s, cut between
// characters (of valid UTF-8, where s is), whose JSON as the store writes
// it takes at most max bytes besides the quotes, and all of s when that
// fits.
func checkCut(t *testing.T, s string, max int) {
	t.Helper()
	got, cut := cutJSON(s, max)
	if !strings.HasPrefix(s, got) {
		t.Fatalf("cutJSON(%q, %d) = %q: not a start", s, max, got)
	}
	if cut == (got == s) {
		t.Fatalf("cutJSON(%q, %d) = %q, cut %v", s, max, got, cut)
	}
	if utf8.ValidString(s) && !utf8.ValidString(got) {
		t.Fatalf("cutJSON(%q, %d) = %q: cut inside a character", s, max, got)
	}
	if n := len(marshalRecord(got)) - 2; n > max {
		t.Fatalf("cutJSON(%q, %d) = %q: %d bytes of JSON", s, max, got, n)
	}
	if !cut {
		return
	}
	// The next character would not have fitted.
	_, size := utf8.DecodeRuneInString(s[len(got):])
	if n := len(marshalRecord(s[:len(got)+size])) - 2; n <= max && n > 0 && jsonLen(s[:len(got)+size])-2 <= max {
		t.Fatalf("cutJSON(%q, %d) = %q: one more character fits", s, max, got)
	}
}

func TestCutJSON(t *testing.T) {
	for _, tc := range []struct {
		s   string
		max int
	}{
		{"", 0}, {"abc", 3}, {"abcd", 3}, {`a"b`, 3}, {"é", 1}, {"éé", 3}, {"\x01\x01", 6}, {"\x01\x01", 11},
		{"a\nb", 3}, {"<&>", 3}, {"\xff\xfe", 6}, {"\u2028x", 6}, {strings.Repeat("x", 100), 10},
		{strings.Repeat("\x00", 1000), 600},
	} {
		checkCut(t, tc.s, tc.max)
	}
}

func FuzzCutJSON(f *testing.F) {
	f.Add("hello", 3)
	f.Add("\x01é\"\\\n\u2028<", 7)
	f.Fuzz(func(t *testing.T, s string, max int) {
		if max < 0 || max > 1<<16 {
			return
		}
		checkCut(t, s, max)
	})
}

// A record keeps a result up to its caps, names what it cut with the full
// size, and stays within MaxRecordBytes with every field at its worst.
func TestResultRecord(t *testing.T) {
	ret, _ := json.Marshal(strings.Repeat("r", 2<<20))
	arts := make([]string, 1000)
	for i := range arts {
		arts[i] = strings.Repeat("a", 4000)
	}
	x := &api.Execution{
		ExecutionID: "exec-1", Status: api.ExecFailed,
		Stdout: strings.Repeat("\x01", 1<<20), Stderr: strings.Repeat("e", 64<<20), ReturnValue: ret,
		Error:     &api.ExecError{Type: strings.Repeat("T", 1000), Message: strings.Repeat("m", 1<<20), Traceback: strings.Repeat("\"", 1<<20)},
		Artifacts: arts,
	}
	b := resultRecord(x)
	if len(b) > MaxRecordBytes-maxStoredCode-maxStoredEvent-maxStoredEnvNames-4096 {
		t.Errorf("a result at its worst: a record of %d bytes", len(b))
	}
	var got api.Execution
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"stdout": 1 << 20, "stderr": 64 << 20, "return_value": int64(len(ret)), "error.type": 1000,
		"error.message": 1 << 20, "error.traceback": 1 << 20, "artifacts": 1000,
	}
	if len(got.Truncated) != len(want) {
		t.Errorf("truncated %v, want %v", got.Truncated, want)
	}
	for k, v := range want {
		if got.Truncated[k] != v {
			t.Errorf("truncated[%s] = %d, want %d", k, got.Truncated[k], v)
		}
	}
	if got.ReturnValue != nil || len(got.Stderr) != maxStoredOutput || len(got.Artifacts) == 0 || len(got.Artifacts) >= 1000 || got.Error.Type == "" {
		t.Errorf("record: return value %d bytes, stderr %d, %d artifacts, error type %q", len(got.ReturnValue), len(got.Stderr), len(got.Artifacts), got.Error.Type)
	}
	// The caller's result is left as it was: the answer has it whole.
	if len(x.Stderr) != 64<<20 || len(x.Artifacts) != 1000 || x.Truncated != nil || len(x.Error.Message) != 1<<20 {
		t.Error("resultRecord changed the result it was given")
	}
	// Within the caps, a record is the result as it is.
	small := &api.Execution{ExecutionID: "exec-2", Status: api.ExecCompleted, Stdout: "<b>hi</b>\n", ReturnValue: json.RawMessage(`{"n":1}`), Artifacts: []string{"a.csv"}}
	var back api.Execution
	if err := json.Unmarshal(resultRecord(small), &back); err != nil || back.Truncated != nil || back.Stdout != small.Stdout || string(back.ReturnValue) != `{"n":1}` {
		t.Errorf("a small result's record: %+v %v", back, err)
	}
}

// A request's record keeps the code's start, size and hash, a small
// event, the variables' names and never their values.
func TestRequestRecord(t *testing.T) {
	env := map[string]string{"TOKEN": "secret-value"}
	for i := range 2000 {
		env["VAR_"+strings.Repeat("x", 200)+string(rune('a'+i%26))+strings.Repeat("y", i%50)] = "v"
	}
	b := requestRecord(api.ExecuteRequest{Code: strings.Repeat("c", 8<<20), Event: json.RawMessage(`"` + strings.Repeat("e", 16<<20) + `"`), EnvVars: env}, "python", 1000)
	if len(b) > maxStoredCode+maxStoredEvent+maxStoredEnvNames+1024 {
		t.Errorf("a request at its worst: a record of %d bytes", len(b))
	}
	if strings.Contains(string(b), "secret-value") {
		t.Error("the record holds a variable's value")
	}
	var r storedRequest
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.CodeBytes != 8<<20 || len(r.Code) != maxStoredCode || len(r.CodeSHA256) != 64 || r.EventBytes != 16<<20+2 || r.Event != nil || len(r.EnvNames) == 0 {
		t.Errorf("record: %d code bytes kept of %d, event %d bytes (%d kept), %d names", len(r.Code), r.CodeBytes, r.EventBytes, len(r.Event), len(r.EnvNames))
	}
	b = requestRecord(api.ExecuteRequest{Code: "print(1)", Event: json.RawMessage(`{"x":1}`)}, "python", 1000)
	if err := json.Unmarshal(b, &r); err != nil || r.Code != "print(1)" || string(r.Event) != `{"x":1}` {
		t.Errorf("a small request's record: %s %v", b, err)
	}
}
