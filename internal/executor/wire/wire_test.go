package wire

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestDecodeRunRequest(t *testing.T) {
	tests := []struct {
		name, body string
		ok         bool
		check      func(*RunRequest) bool
	}{
		{name: "defaults", body: `{"language":"python","code":"print(1)"}`, ok: true, check: func(r *RunRequest) bool {
			return r.TimeoutMs == DefaultTimeoutMs && r.OutputLimitBytes == DefaultOutputLimit && r.Cwd == "/ws" && string(r.Event) == "null"
		}},
		{name: "all fields", body: `{"id":"e-1","language":"python","code":"x","event":{"a":[1]},"env":{"A":"b"},"cwd":"/tmp","timeout_ms":5,"output_limit_bytes":10,"context_id":"c:1"}`, ok: true,
			check: func(r *RunRequest) bool {
				return r.ID == "e-1" && string(r.Event) == `{"a":[1]}` && r.Env["A"] == "b" && r.Cwd == "/tmp" && r.TimeoutMs == 5 && r.OutputLimitBytes == 10 && r.ContextID == "c:1"
			}},
		{name: "bash", body: `{"language":"bash","code":"echo"}`, ok: true},
		{name: "max timeout", body: `{"language":"bash","code":"x","timeout_ms":86400000}`, ok: true},
		{name: "no language", body: `{"code":"x"}`},
		{name: "unknown language", body: `{"language":"ruby","code":"x"}`},
		{name: "unknown field", body: `{"language":"python","code":"x","timeout":5}`},
		{name: "not json", body: `language=python`},
		{name: "trailing data", body: `{"language":"python","code":"x"} {}`},
		{name: "negative timeout", body: `{"language":"python","code":"x","timeout_ms":-1}`},
		{name: "timeout over a day", body: `{"language":"python","code":"x","timeout_ms":86400001}`},
		{name: "output limit over 64 MiB", body: `{"language":"python","code":"x","output_limit_bytes":67108865}`},
		{name: "relative cwd", body: `{"language":"python","code":"x","cwd":"work"}`},
		{name: "bad id", body: `{"id":"a b","language":"python","code":"x"}`},
		{name: "long id", body: `{"id":"` + strings.Repeat("a", 129) + `","language":"python","code":"x"}`},
		{name: "context for bash", body: `{"language":"bash","code":"x","context_id":"c"}`},
		{name: "bad context id", body: `{"language":"python","code":"x","context_id":"../c"}`},
		{name: "env name with =", body: `{"language":"python","code":"x","env":{"A=B":"c"}}`},
		{name: "env value with NUL", body: `{"language":"python","code":"x","env":{"A":"b\u0000"}}`},
		{name: "bash code with NUL", body: `{"language":"bash","code":"echo \u0000"}`},
		{name: "python code with NUL is Python's business", body: `{"language":"python","code":"\u0000"}`, ok: true},
		{name: "conversation", body: `{"language":"bash","code":"x","conversation_id":"conv-1.a_B"}`, ok: true,
			check: func(r *RunRequest) bool { return r.ConversationID == "conv-1.a_B" }},
		{name: "conversation of 128", body: `{"language":"python","code":"x","conversation_id":"` + strings.Repeat("c", 128) + `"}`, ok: true},
		{name: "conversation of 129", body: `{"language":"python","code":"x","conversation_id":"` + strings.Repeat("c", 129) + `"}`},
		{name: "conversation with slash", body: `{"language":"python","code":"x","conversation_id":"a/b"}`},
		{name: "conversation dotdot", body: `{"language":"python","code":"x","conversation_id":".."}`},
		{name: "conversation with dotdot inside", body: `{"language":"python","code":"x","conversation_id":"a..b"}`},
		{name: "conversation with leading dot", body: `{"language":"python","code":"x","conversation_id":".a"}`},
		{name: "conversation with colon", body: `{"language":"python","code":"x","conversation_id":"a:b"}`},
		{name: "conversation with newline", body: `{"language":"python","code":"x","conversation_id":"a\n"}`},
		{name: "conversation with NUL", body: `{"language":"python","code":"x","conversation_id":"a\u0000"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := DecodeRunRequest(strings.NewReader(tc.body), "/ws")
			if !tc.ok {
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("err %v, want ErrInvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.check != nil && !tc.check(r) {
				t.Errorf("decoded %+v", r)
			}
		})
	}
}

func FuzzDecodeRunRequest(f *testing.F) {
	for _, s := range []string{
		`{"language":"python","code":"print(1)"}`,
		`{"id":"x","language":"bash","code":"echo","env":{"A":"1"},"timeout_ms":10,"output_limit_bytes":1,"cwd":"/"}`,
		`{"language":"python","code":"x","event":[1,{"a":null}],"context_id":"c"}`,
		`{"language":"python","code":"x","conversation_id":"c1","context_id":"c"}`,
		`{"language":"python","code":"x","timeout_ms":1e3}`,
		`{}`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRunRequest(strings.NewReader(string(body)), "/workspace")
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error outside the invalid-argument category: %v", err)
			}
			return
		}
		// Whatever was accepted is within every bound.
		switch {
		case r.Language != LanguagePython && r.Language != LanguageBash:
			t.Fatalf("language %q", r.Language)
		case r.TimeoutMs < 1 || r.TimeoutMs > MaxTimeoutMs:
			t.Fatalf("timeout %d", r.TimeoutMs)
		case r.OutputLimitBytes < 1 || r.OutputLimitBytes > MaxOutputLimit:
			t.Fatalf("output limit %d", r.OutputLimitBytes)
		case !strings.HasPrefix(r.Cwd, "/") || strings.ContainsRune(r.Cwd, 0):
			t.Fatalf("cwd %q", r.Cwd)
		case len(r.Code) > MaxCodeBytes || len(r.Event) == 0:
			t.Fatalf("code %d event %q", len(r.Code), r.Event)
		case r.ContextID != "" && (r.Language != LanguagePython || !ValidID(r.ContextID)):
			t.Fatalf("context %q", r.ContextID)
		case r.ID != "" && !ValidID(r.ID):
			t.Fatalf("id %q", r.ID)
		case r.ConversationID != "" && (strings.ContainsAny(r.ConversationID, "/\x00") || strings.Contains(r.ConversationID, "..") ||
			r.ConversationID[0] == '.' || len(r.ConversationID) > 128):
			t.Fatalf("conversation %q names something other than one directory", r.ConversationID)
		}
		for k, v := range r.Env {
			if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
				t.Fatalf("env %q=%q", k, v)
			}
		}
	})
}

// The validators match the patterns they replaced.
func TestIDsAsThePatternsSaid(t *testing.T) {
	id := regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	conv := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	alphabet := []string{"a", "Z", "0", ".", "_", "-", ":", "/", " ", "é"}
	var all func(s string, n int)
	all = func(s string, n int) {
		if got, want := ValidID(s), id.MatchString(s); got != want {
			t.Errorf("ValidID(%q) = %v, the pattern %v", s, got, want)
		}
		if got, want := ValidConversationID(s), conv.MatchString(s) && !strings.Contains(s, ".."); got != want {
			t.Errorf("ValidConversationID(%q) = %v, the pattern %v", s, got, want)
		}
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			all(s+c, n-1)
		}
	}
	all("", 4)
	for _, n := range []int{127, 128, 129} {
		s := strings.Repeat("a", n)
		if ValidID(s) != id.MatchString(s) || ValidConversationID(s) != conv.MatchString(s) {
			t.Errorf("an id of %d bytes", n)
		}
	}
}
