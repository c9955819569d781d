package template

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/runtime"
)

func TestValidate(t *testing.T) {
	good := Spec{
		Name:      "my-template-1",
		Release:   "bookworm",
		Packages:  []string{"python3-pandas", "g++", "libstdc++6", "python3.11"},
		Stubs:     []string{"python3-pythran"},
		Env:       map[string]string{"MPLBACKEND": "Agg", "_X1": ""},
		Files:     map[string]string{"/etc/sbx/motd": "hi", "/usr/local/bin/tool": "#!/bin/sh\n"},
		Resources: runtime.Resources{CPU: 0.5, MemoryMB: 256},
		Timeout:   Duration(time.Minute),
		Runtime:   "runsc",
		Preload:   []string{"numpy", "matplotlib.pyplot", "_private"},
	}
	tests := []struct {
		name   string
		change func(*Spec)
		ok     bool
	}{
		{"good", func(*Spec) {}, true},
		{"minimal", func(s *Spec) { *s = Spec{Name: "p"} }, true},
		{"trixie", func(s *Spec) { s.Release = "trixie" }, true},
		{"every runtime", func(s *Spec) { s.Runtime = "crun" }, true},
		{"empty name", func(s *Spec) { s.Name = "" }, false},
		{"upper-case name", func(s *Spec) { s.Name = "Python" }, false},
		{"name starts with dash", func(s *Spec) { s.Name = "-py" }, false},
		{"name too long", func(s *Spec) { s.Name = strings.Repeat("a", 64) }, false},
		{"name of 63", func(s *Spec) { s.Name = strings.Repeat("a", 63) }, true},
		{"name with dot", func(s *Spec) { s.Name = "py.3" }, false},
		{"unknown release", func(s *Spec) { s.Release = "sid" }, false},
		{"package with version", func(s *Spec) { s.Packages = []string{"python3=3.11"} }, false},
		{"package as option", func(s *Spec) { s.Packages = []string{"-oAPT::X=1"} }, false},
		{"one-letter package", func(s *Spec) { s.Packages = []string{"a"} }, false},
		{"package with space", func(s *Spec) { s.Packages = []string{"a b"} }, false},
		{"too many packages", func(s *Spec) { s.Packages = make([]string, maxPackages+1) }, false},
		{"stub of python3", func(s *Spec) { s.Stubs = []string{"python3"} }, false},
		{"stub also installed", func(s *Spec) { s.Stubs = []string{"g++"} }, false},
		{"bad stub", func(s *Spec) { s.Stubs = []string{"X"} }, false},
		{"relative file", func(s *Spec) { s.Files = map[string]string{"etc/x": ""} }, false},
		{"unclean file", func(s *Spec) { s.Files = map[string]string{"/etc/../x": ""} }, false},
		{"trailing slash", func(s *Spec) { s.Files = map[string]string{"/etc/x/": ""} }, false},
		{"root file", func(s *Spec) { s.Files = map[string]string{"/": ""} }, false},
		{"file in /proc", func(s *Spec) { s.Files = map[string]string{"/proc/x": ""} }, false},
		{"file is /tmp", func(s *Spec) { s.Files = map[string]string{"/tmp": ""} }, false},
		{"file in /workspace", func(s *Spec) { s.Files = map[string]string{"/workspace/a/b": ""} }, false},
		{"file in /run/sbx", func(s *Spec) { s.Files = map[string]string{"/run/sbx/executor.sock": ""} }, false},
		{"file in /opt/sbx", func(s *Spec) { s.Files = map[string]string{"/opt/sbx/x": ""} }, false},
		{"file in /devices", func(s *Spec) { s.Files = map[string]string{"/devices/x": ""} }, true},
		{"file in /run", func(s *Spec) { s.Files = map[string]string{"/run/other": ""} }, true},
		{"file with NUL", func(s *Spec) { s.Files = map[string]string{"/etc/a\x00b": ""} }, false},
		{"file too big", func(s *Spec) { s.Files = map[string]string{"/x": strings.Repeat("x", maxFilesBytes+1)} }, false},
		{"env key with dash", func(s *Spec) { s.Env = map[string]string{"A-B": "1"} }, false},
		{"env key digit", func(s *Spec) { s.Env = map[string]string{"1A": "1"} }, false},
		{"env value NUL", func(s *Spec) { s.Env = map[string]string{"A": "\x00"} }, false},
		{"negative memory", func(s *Spec) { s.Resources.MemoryMB = -1 }, false},
		{"negative cpu", func(s *Spec) { s.Resources.CPU = -0.5 }, false},
		{"negative timeout", func(s *Spec) { s.Timeout = Duration(-time.Second) }, false},
		{"huge timeout", func(s *Spec) { s.Timeout = Duration(25 * time.Hour) }, false},
		{"unknown runtime", func(s *Spec) { s.Runtime = "docker" }, false},
		{"preload path", func(s *Spec) { s.Preload = []string{"os/path"} }, false},
		{"preload dots", func(s *Spec) { s.Preload = []string{"a..b"} }, false},
		{"preload leading digit", func(s *Spec) { s.Preload = []string{"3d"} }, false},
		{"preload code", func(s *Spec) { s.Preload = []string{"os; import sys"} }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good.clone()
			tt.change(&s)
			err := s.Validate()
			if tt.ok && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if !tt.ok {
				if err == nil {
					t.Fatal("Validate accepted a bad spec")
				}
				if !errors.Is(err, errdefs.ErrInvalidArgument) {
					t.Fatalf("error %v does not wrap ErrInvalidArgument", err)
				}
			}
		})
	}
}

func TestBuiltinsValid(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Builtins() {
		if err := s.Validate(); err != nil {
			t.Errorf("built-in %s: %v", s.Name, err)
		}
		if seen[s.Hash()] {
			t.Errorf("built-in %s shares its hash with another", s.Name)
		}
		seen[s.Hash()] = true
		got, ok := Builtin(s.Name)
		if !ok || got.Hash() != s.Hash() {
			t.Errorf("Builtin(%q) does not return the built-in", s.Name)
		}
	}
	for _, name := range []string{"python", "python-datascience", "file-parser"} {
		if _, ok := Builtin(name); !ok {
			t.Errorf("no built-in %q", name)
		}
	}
	// Callers may change what they get without changing the built-ins.
	s, _ := Builtin("python-datascience")
	s.Packages[0], s.Env["MPLBACKEND"] = "changed", "changed"
	if again, _ := Builtin("python-datascience"); again.Packages[0] == "changed" || again.Env["MPLBACKEND"] == "changed" {
		t.Error("Builtin returned the built-in itself, not a copy")
	}
}

func TestHash(t *testing.T) {
	base := Spec{
		Name:     "a",
		Packages: []string{"python3-numpy", "curl"},
		Files:    map[string]string{"/etc/a": "1", "/etc/b": "2"},
	}
	h := base.Hash()
	if len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		t.Fatalf("Hash = %q, want 64 hex digits", h)
	}
	if ShortHash(h) != h[:12] {
		t.Errorf("ShortHash = %q", ShortHash(h))
	}
	same := map[string]func(*Spec){
		"again":             func(*Spec) {},
		"name":              func(s *Spec) { s.Name = "other" },
		"env":               func(s *Spec) { s.Env = map[string]string{"A": "1"} },
		"timeout":           func(s *Spec) { s.Timeout = Duration(time.Hour) },
		"resources":         func(s *Spec) { s.Resources.MemoryMB = 4096 },
		"runtime":           func(s *Spec) { s.Runtime = "runsc" },
		"preload":           func(s *Spec) { s.Preload = []string{"numpy"} },
		"package order":     func(s *Spec) { s.Packages = []string{"curl", "python3-numpy"} },
		"duplicate package": func(s *Spec) { s.Packages = append(s.Packages, "curl") },
		"explicit python3":  func(s *Spec) { s.Packages = append(s.Packages, "python3") },
		"default release":   func(s *Spec) { s.Release = "bookworm" },
	}
	for name, change := range same {
		s := base.clone()
		change(&s)
		if s.Hash() != h {
			t.Errorf("changing %s changed the hash", name)
		}
	}
	differs := map[string]func(*Spec){
		"release":        func(s *Spec) { s.Release = "trixie" },
		"package added":  func(s *Spec) { s.Packages = append(s.Packages, "jq") },
		"package gone":   func(s *Spec) { s.Packages = s.Packages[:1] },
		"stub":           func(s *Spec) { s.Stubs = []string{"python3-pythran"} },
		"file content":   func(s *Spec) { s.Files["/etc/a"] = "3" },
		"file path":      func(s *Spec) { s.Files = map[string]string{"/etc/c": "1", "/etc/b": "2"} },
		"file added":     func(s *Spec) { s.Files["/etc/c"] = "" },
		"file moved":     func(s *Spec) { s.Files = map[string]string{"/etc/a": "2", "/etc/b": "1"} },
		"invalid utf-8a": func(s *Spec) { s.Files["/etc/a"] = "\xff" },
	}
	seen := map[string]string{h: "base"}
	for name, change := range differs {
		s := base.clone()
		change(&s)
		if other, dup := seen[s.Hash()]; dup {
			t.Errorf("changing %s gives the hash of %s", name, other)
		}
		seen[s.Hash()] = name
	}
	// Invalid UTF-8 must not collapse into one hash (JSON would make both
	// U+FFFD).
	a, b := base.clone(), base.clone()
	a.Files["/etc/a"], b.Files["/etc/a"] = "\xff", "\xfe"
	if a.Hash() == b.Hash() {
		t.Error("two different invalid UTF-8 contents hash the same")
	}
	if base.HashWithShift(0) == h {
		t.Error("the uid shift does not change the hash")
	}
}

func TestSpecJSON(t *testing.T) {
	s, _ := Builtin("python-datascience")
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back Spec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Hash() != s.Hash() || back.Timeout != s.Timeout || back.Env["MPLBACKEND"] != "Agg" {
		t.Errorf("JSON round trip changed the spec: %s", b)
	}
	if !strings.Contains(string(b), `"timeout":"2m0s"`) {
		t.Errorf("timeout is not written as a duration string: %s", b)
	}
}

// FuzzSpec checks that Validate and Hash never panic, that Hash is
// deterministic, and that a valid spec survives a JSON round trip.
func FuzzSpec(f *testing.F) {
	f.Add(`{"name":"python"}`)
	f.Add(`{"name":"x","packages":["a+b","c.d"],"files":{"/etc/x":"y"},"env":{"A":"b"},"preload":["a.b"],"timeout":"3s"}`)
	f.Add(`{"name":"x","files":{"/tmp/../etc":""},"runtime":"runsc","release":"trixie"}`)
	f.Fuzz(func(t *testing.T, in string) {
		var s Spec
		if json.Unmarshal([]byte(in), &s) != nil {
			return
		}
		h := s.Hash()
		if s.Hash() != h {
			t.Fatal("Hash is not deterministic")
		}
		if s.Validate() != nil {
			return
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back Spec
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if err := back.Validate(); err != nil {
			t.Fatalf("valid spec invalid after a round trip: %v", err)
		}
		if back.Hash() != h {
			t.Fatalf("hash changed in a round trip: %s", b)
		}
	})
}
