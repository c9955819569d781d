package executor

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestSplitUTF8(t *testing.T) {
	tests := []struct{ in, complete, tail string }{
		{"", "", ""},
		{"abc", "abc", ""},
		{"h\xc3\xa9", "h\xc3\xa9", ""},         // é complete
		{"h\xc3", "h", "\xc3"},                 // é cut after its first byte
		{"\xe2\x82", "", "\xe2\x82"},           // € cut after two of three
		{"a\xf0\x9f\x98", "a", "\xf0\x9f\x98"}, // 😀 cut after three of four
		{"a\xf0\x9f\x98\x80", "a\xf0\x9f\x98\x80", ""},
		{"a\xff", "a\xff", ""},               // invalid: never completes, not held
		{"a\x80", "a\x80", ""},               // stray continuation byte
		{"\xc3\xa9\xe2", "\xc3\xa9", "\xe2"}, // complete rune, then a new start
		{"ab\xed\xa0", "ab\xed\xa0", ""},     // a surrogate's prefix is invalid already: not held
	}
	for _, tc := range tests {
		c, tl := splitUTF8([]byte(tc.in))
		if string(c) != tc.complete || string(tl) != tc.tail {
			t.Errorf("splitUTF8(%q) = %q, %q; want %q, %q", tc.in, c, tl, tc.complete, tc.tail)
		}
	}
}

func FuzzSplitUTF8(f *testing.F) {
	for _, s := range []string{"", "abc", "h\xc3", "€😀", "\xff\xfe", "a\xf0\x9f\x98"} {
		f.Add([]byte(s), 3)
	}
	f.Fuzz(func(t *testing.T, b []byte, step int) {
		c, tl := splitUTF8(b)
		if !bytes.Equal(append(append([]byte{}, c...), tl...), b) {
			t.Fatalf("parts do not add up to the input")
		}
		if len(tl) > utf8.UTFMax-1 {
			t.Fatalf("tail of %d bytes", len(tl))
		}
		if len(tl) > 0 && (!utf8.RuneStart(tl[0]) || utf8.FullRune(tl)) {
			t.Fatalf("tail %q is not an incomplete sequence", tl)
		}
		if utf8.Valid(b) && !utf8.Valid(c) {
			t.Fatalf("complete part of valid input is invalid")
		}
		// Streamed through a capture in pieces of any size, valid text
		// comes out as whole characters and unchanged.
		if step < 1 {
			step = 1
		}
		step = step%17 + 1
		cp := newCapture(int64(len(b) + 1))
		var out []byte
		for i := 0; i < len(b); i += step {
			cp.write(streamStdout, b[i:min(i+step, len(b))])
			for _, ch := range cp.take(false) {
				if utf8.Valid(b) && !utf8.ValidString(ch.data) {
					t.Fatalf("chunk %q of valid input is invalid", ch.data)
				}
				out = append(out, ch.data...)
			}
		}
		for _, ch := range cp.take(true) {
			out = append(out, ch.data...)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("streamed %q, want %q", out, b)
		}
	})
}

func TestCaptureTruncates(t *testing.T) {
	c := newCapture(10)
	c.write(streamStdout, []byte("12345"))
	c.write(streamStderr, []byte("err"))
	c.write(streamStdout, []byte("6789é-more")) // the cap falls inside é
	c.write(streamStdout, []byte("lost"))
	var streamed [2]strings.Builder
	for _, ch := range append(c.take(false), c.take(true)...) {
		streamed[ch.stream].WriteString(ch.data)
	}
	out, trunc := c.text(streamStdout)
	omitted := len("12345") + len("6789é-more") + len("lost") - 9
	want := "123456789\n" + truncationMarker(int64(omitted))
	if !trunc || out != want {
		t.Errorf("stdout %q (truncated %v), want %q", out, trunc, want)
	}
	if streamed[streamStdout].String() != out {
		t.Errorf("streamed %q, result %q", streamed[streamStdout].String(), out)
	}
	if e, trunc := c.text(streamStderr); e != "err" || trunc || streamed[streamStderr].String() != "err" {
		t.Errorf("stderr %q %v", e, trunc)
	}
}

func TestCaptureKeepsOrderAcrossStreams(t *testing.T) {
	c := newCapture(100)
	c.write(streamStdout, []byte("a"))
	c.write(streamStderr, []byte("b"))
	c.write(streamStdout, []byte("c"))
	c.write(streamStdout, []byte("d"))
	var got []string
	for _, ch := range c.take(false) {
		got = append(got, streamNames[ch.stream]+":"+ch.data)
	}
	if strings.Join(got, ",") != "stdout:a,stderr:b,stdout:cd" {
		t.Errorf("chunks %v", got)
	}
}

// TestCaptureBoundedSegments: alternating writes that nobody takes do not
// grow without bound.
func TestCaptureBoundedSegments(t *testing.T) {
	c := newCapture(1 << 20)
	for i := range 100_000 {
		c.write(i%2, []byte("x"))
	}
	if len(c.segs) > maxSegments {
		t.Fatalf("%d segments", len(c.segs))
	}
	n := 0
	for _, ch := range c.take(true) {
		n += len(ch.data)
	}
	if n != 100_000 {
		t.Errorf("took %d bytes, want 100000", n)
	}
}
