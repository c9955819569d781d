package workspace

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestCleanPath(t *testing.T) {
	long := strings.Repeat("a", MaxNameLen)
	good := []struct{ in, want string }{
		{"", "."},
		{".", "."},
		{"./", "."},
		{"a", "a"},
		{"a/b/c.txt", "a/b/c.txt"},
		{"a//b", "a/b"},
		{"./a/./b/", "a/b"},
		{"a/b///", "a/b"},
		{"...", "..."},
		{"..a/b..", "..a/b.."},
		{".hidden", ".hidden"},
		{"数据/图表.png", "数据/图表.png"},
		{"with space/and:colon", "with space/and:colon"},
		{long, long},
		{strings.Repeat("a/", MaxPathLen/2), strings.TrimSuffix(strings.Repeat("a/", MaxPathLen/2), "/")},
	}
	for _, tc := range good {
		t.Run("ok "+tc.in, func(t *testing.T) {
			got, err := CleanPath(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("CleanPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
	bad := []struct{ name, in, msg string }{
		{"absolute", "/etc/passwd", "must be relative"},
		{"absolute root", "/", "must be relative"},
		{"sandbox path", "/workspace/data.csv", `"data.csv", not the path inside the sandbox`},
		{"dotdot", "..", `contains ".."`},
		{"dotdot prefix", "../outside", `contains ".."`},
		{"dotdot inside", "a/../b", `contains ".."`},
		{"dotdot trailing", "a/..", `contains ".."`},
		{"dotdot slash", "a/../", `contains ".."`},
		{"nul", "a\x00b", "contains NUL"},
		{"newline", "a\nb", "control character"},
		{"del", "a\x7fb", "control character"},
		{"backslash", `a\b`, "backslash"},
		{"backslash dotdot", `..\..\etc`, "backslash"},
		{"invalid utf8", "a\xffb", "UTF-8"},
		{"long component", long + "x", "longer than 255"},
		{"long path", strings.Repeat("a/", MaxPathLen/2) + "a", "longer than the limit"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CleanPath(tc.in)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("CleanPath(%q) = %q, %v; want ErrInvalidArgument", tc.in, got, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not say %q", err, tc.msg)
			}
		})
	}
}

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"c1", true},
		{"conv-2024_01.a", true},
		{"A", true},
		{strings.Repeat("a", 128), true},
		{"", false},
		{strings.Repeat("a", 129), false},
		{".", false},
		{"..", false},
		{"a..b", false},
		{".hidden", false},
		{"-flag", false},
		{"_x", false},
		{"a/b", false},
		{"a b", false},
		{"a\x00", false},
		{"é", false},
	} {
		t.Run(tc.id, func(t *testing.T) {
			if got := ValidID(tc.id); got != tc.want {
				t.Errorf("ValidID(%q) = %v, want %v", tc.id, got, tc.want)
			}
		})
	}
}

func TestConversationDir(t *testing.T) {
	if got := ConversationDir("c1"); got != "uploads/c1/temparea" {
		t.Errorf("ConversationDir = %q", got)
	}
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"", ".", "a/b", "../x", "/etc", "a//b/", "a/./b", `a\b`, "a\x00", "..a", "./..", "a/..b/.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		out, err := CleanPath(p)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("CleanPath(%q): %v is not ErrInvalidArgument", p, err)
			}
			return
		}
		switch {
		case out == "":
			t.Fatalf("CleanPath(%q) is empty", p)
		case strings.HasPrefix(out, "/"):
			t.Fatalf("CleanPath(%q) = %q is absolute", p, out)
		case strings.HasSuffix(out, "/"):
			t.Fatalf("CleanPath(%q) = %q ends in a slash", p, out)
		case strings.Contains(out, "//"):
			t.Fatalf("CleanPath(%q) = %q has an empty component", p, out)
		case strings.ContainsRune(out, 0):
			t.Fatalf("CleanPath(%q) = %q has NUL", p, out)
		case len(out) > MaxPathLen:
			t.Fatalf("CleanPath(%q) is %d bytes", p, len(out))
		}
		for _, c := range strings.Split(out, "/") {
			if c == ".." || (c == "." && out != ".") || len(c) > MaxNameLen {
				t.Fatalf("CleanPath(%q) = %q has component %q", p, out, c)
			}
		}
		if again, err := CleanPath(out); err != nil || again != out {
			t.Fatalf("not idempotent: CleanPath(%q) = %q, then %q, %v", p, out, again, err)
		}
		if !filepath.IsLocal(out) {
			t.Fatalf("CleanPath(%q) = %q is not local", p, out)
		}
		const root = "/srv/ws"
		if j := filepath.Join(root, out); j != root && !strings.HasPrefix(j, root+"/") {
			t.Fatalf("CleanPath(%q) = %q joins to %q, outside %s", p, out, j, root)
		}
	})
}

func TestManaged(t *testing.T) {
	for rel, managed := range map[string]bool{
		".": true, "uploads": true, "uploads/c1/temparea/a.pdf": true, ".resources": true, ".resources/skills/x.md": true,
		"data.csv": false, "uploadsx": false, "my/uploads": false, ".resourcesx/a": false, "a/.resources": false,
	} {
		if got := Managed(rel) != ""; got != managed {
			t.Errorf("Managed(%q) = %q, want managed %v", rel, Managed(rel), managed)
		}
	}
}

func TestSandboxPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/workspace", "."},
		{"/workspace/", "."},
		{"/home/user", "."},
		{"/home/user/a.txt", "a.txt"},
		{"/workspace/a.txt", "a.txt"},
		{"/workspace//d/./b.txt", "d/b.txt"},
		{"a.txt", "a.txt"},
		{"", "."},
		{"/etc/passwd", ""},
		{"/workspacex/a", ""},
		{"/home/user2/a", ""},
		{"/home", ""},
		{"//workspace/a", ""},
		{"/workspace/../etc/passwd", ""},
		{"/home/user/../../etc", ""},
	} {
		got, err := SandboxPath(tc.in)
		if got != tc.want || (tc.want == "") != (err != nil) {
			t.Errorf("SandboxPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SandboxPath(%q): %v, want ErrInvalidArgument", tc.in, err)
		}
	}
}

// FuzzSandboxPath: whatever the model sends, the result is a clean
// workspace path or a client error.
func FuzzSandboxPath(f *testing.F) {
	for _, s := range []string{"/workspace/a", "/home/user", "/etc/x", "a/../b", "/workspace/..", "/home/user//x/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rel, err := SandboxPath(p)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("SandboxPath(%q): %v", p, err)
			}
			return
		}
		if again, err := CleanPath(rel); err != nil || again != rel {
			t.Fatalf("SandboxPath(%q) = %q, not clean (%q, %v)", p, rel, again, err)
		}
	})
}
