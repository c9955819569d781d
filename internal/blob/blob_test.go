package blob

import (
	"strings"
	"testing"
)

func TestValidPrefix(t *testing.T) {
	for prefix, want := range map[string]bool{
		"":                              true,
		"a":                             true,
		"a/":                            true,
		"a/b":                           true,
		"a/b.c/-d_":                     true,
		strings.Repeat("a/", 15):        true,
		strings.Repeat("a/", 16):        false,
		".":                             false,
		"a/.":                           false,
		"a//":                           false,
		"/a":                            false,
		"../":                           false,
		"a/..":                          false,
		"a b":                           false,
		strings.Repeat("x", 256):        false,
		strings.Repeat("x", 255) + "/y": true,
	} {
		if got := ValidPrefix(prefix); got != want {
			t.Errorf("ValidPrefix(%q) = %v, want %v", prefix, got, want)
		}
	}
}

// Every valid key is a valid prefix, and so is each of its beginnings.
func FuzzValidPrefix(f *testing.F) {
	f.Add("a/b.c")
	f.Add("x-y/z_0")
	f.Fuzz(func(t *testing.T, key string) {
		if !ValidKey(key) {
			return
		}
		for i := range len(key) + 1 {
			if !ValidPrefix(key[:i]) {
				t.Fatalf("ValidPrefix(%q) is false, of a beginning of the key %q", key[:i], key)
			}
		}
	})
}
