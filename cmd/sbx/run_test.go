package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestParseMemory(t *testing.T) {
	for in, want := range map[string]int64{
		"512M": 512, "512m": 512, "512MiB": 512, "512MB": 512, "1G": 1024, "1.5GB": 1536, "2gi": 2048,
		"256": 256, "65536K": 64, " 64M ": 64,
	} {
		if got, err := parseMemory(in); err != nil || got != want {
			t.Errorf("parseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1G", "0", "1K", "8M", "2T", "NaN", "1e400"} {
		if got, err := parseMemory(in); err == nil {
			t.Errorf("parseMemory(%q) = %d, want an error", in, got)
		}
	}
}

// TestRunUsage checks that bad input is refused before any sandbox is
// made (exit 2, a message naming the problem).
func TestRunUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{nil, "no code"},
		{[]string{"-c", "x", "-f", "y"}, "not both"},
		{[]string{"-c", "x", "extra"}, "unexpected argument"},
		{[]string{"--event", "{", "-c", "x"}, "not valid JSON"},
		{[]string{"--env", "NOEQUALS", "-c", "x"}, "KEY=VALUE"},
		{[]string{"--memory", "lots", "-c", "x"}, "--memory"},
		{[]string{"--cpu", "-1", "-c", "x"}, "negative"},
		{[]string{"--language", "cobol", "-c", "x"}, "cobol"},
		{[]string{"--timeout", "-5s", "-c", "x"}, "negative"},
		{[]string{"--template", "nope-not-here", "-c", "x"}, "nope-not-here"},
		{[]string{"-f", "/nonexistent/file.py"}, "no such file"},
	} {
		var out, errb bytes.Buffer
		t.Setenv("SBX_DATA_DIR", t.TempDir())
		code := run(context.Background(), append([]string{"run"}, tc.args...), &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), tc.msg) || out.Len() != 0 {
			t.Errorf("sbx run %q: exit %d, stderr %q, stdout %q; want exit 2 mentioning %q", tc.args, code, errb.String(), out.String(), tc.msg)
		}
	}
}

func TestUnknownCommand(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"frobnicate"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "unknown command") {
		t.Errorf("exit %d stderr %q", code, errb.String())
	}
}
