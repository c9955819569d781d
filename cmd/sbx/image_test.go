package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestImageUsageErrors(t *testing.T) {
	cases := [][]string{
		{"image"},
		{"image", "build", "--tag", "sbx/x:1", "-o", "x.tar"},                                      // neither --template nor --dir
		{"image", "build", "--template", "python", "--dir", ".", "--tag", "sbx/x:1", "-o", "x"},    // both
		{"image", "build", "--dir", ".", "-o", "x.tar"},                                            // no tag
		{"image", "build", "--dir", ".", "--tag", "sbx/x:1"},                                       // no output
		{"image", "build", "--dir", ".", "--tag", "sbx/x:1", "-o", "x", "--push"},                  // two outputs
		{"image", "build", "--dir", ".", "--tag", "sbx/x:1", "-o", "x", "--add", "a:rel"},          // relative destination
		{"image", "build", "--dir", ".", "--tag", "sbx/x:1", "-o", "x", "--add", "a:/x:4755"},      // set-id mode
		{"image", "build", "--dir", ".", "--tag", "Bad Ref", "-o", "x"},                            // bad reference
		{"image", "build", "--dir", ".", "--tag", "sbx/x:1", "-o", "x", "--entrypoint", "[1]"},     // not strings
		{"image", "build", "--template", "python", "--add", "a:/x", "--tag", "sbx/x:1", "-o", "x"}, // --add on a template
		{"image", "push", "--template", "python"},                                                  // no registry
		{"image", "nope"},
	}
	for _, args := range cases {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", strings.Join(args, " "), code, errb.String())
		}
	}
}
