package blob

import (
	"regexp"
	"strings"
	"testing"
)

// The validators match the patterns they replaced, on every string of a
// few characters from an alphabet around their edges, and on long ones.
func TestKeysAsThePatternsSaid(t *testing.T) {
	segment := regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}$`)
	start := regexp.MustCompile(`^([A-Za-z0-9_-][A-Za-z0-9._-]{0,254})?$`)
	alphabet := []string{"a", "Z", "0", ".", "_", "-", "/", " ", "é", ":", "\x00"}
	var all func(prefix string, n int)
	all = func(prefix string, n int) {
		if got, want := validSegment(prefix), segment.MatchString(prefix); got != want {
			t.Errorf("validSegment(%q) = %v, the pattern %v", prefix, got, want)
		}
		last := prefix[strings.LastIndexByte(prefix, '/')+1:]
		if got, want := last == "" || validSegment(last), start.MatchString(last); got != want {
			t.Errorf("segment start %q: %v, the pattern %v", last, got, want)
		}
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			all(prefix+c, n-1)
		}
	}
	all("", 4)
	for _, n := range []int{254, 255, 256} {
		s := strings.Repeat("a", n)
		if validSegment(s) != segment.MatchString(s) {
			t.Errorf("a segment of %d bytes: %v", n, validSegment(s))
		}
	}
}
