package s3

import (
	"errors"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

func TestParseURL(t *testing.T) {
	for raw, want := range map[string]location{
		"s3://bucket":         {bucket: "bucket"},
		"s3://bucket/":        {bucket: "bucket"},
		"s3://my.bucket-1/a/": {bucket: "my.bucket-1", prefix: "a/"},
		"s3://b12/pre/fix?endpoint=http://127.0.0.1:9000/&region=eu-west-1": {
			bucket: "b12", prefix: "pre/fix/", endpoint: "http://127.0.0.1:9000", region: "eu-west-1"},
		"s3://bucket?endpoint=https://s3.example.com/base": {bucket: "bucket", endpoint: "https://s3.example.com/base"},
	} {
		if got, err := parseURL(raw); err != nil || got != want {
			t.Errorf("parseURL(%s) = %+v, %v; want %+v", raw, got, err, want)
		}
	}
	for _, raw := range []string{"", "s3:", "s3://", "s3://ab", "s3://bucket#x", "s3:bucket", "s3://bucket?region=a&region=b",
		"s3://bucket?endpoint=ftp://x", "s3://bucket?endpoint=http://u:p@x", "s3://bucket/.hidden", "s3://bucket:9000"} {
		if _, err := parseURL(raw); !errors.Is(err, errdefs.ErrInvalidArgument) || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseURL(%q) = %v, want one line of ErrInvalidArgument", raw, err)
		}
	}
}

// Whatever the URL, parseURL gives a location whose keys are valid, or
// one line of ErrInvalidArgument that shows no password.
func FuzzParseURL(f *testing.F) {
	f.Add("s3://bucket/pre/fix?endpoint=http://127.0.0.1:9000&region=us-east-1")
	f.Add("s3://user:hunter2@bucket")
	f.Add("s3://b.c/%2e%2e/x")
	f.Add("s3://user:hunter2@bucket/%zz")
	f.Fuzz(func(t *testing.T, raw string) {
		loc, err := parseURL(raw)
		if err != nil {
			leaked := strings.Count(raw, "hunter2") == 1 && hasPassword(raw, "hunter2") && strings.Contains(err.Error(), "hunter2")
			if !errors.Is(err, errdefs.ErrInvalidArgument) || strings.Contains(err.Error(), "\n") || leaked {
				t.Fatalf("parseURL(%q): %v", raw, err)
			}
			return
		}
		if !bucketName.MatchString(loc.bucket) || (loc.prefix != "" && (!strings.HasSuffix(loc.prefix, "/") || !blob.ValidKey(strings.TrimSuffix(loc.prefix, "/")))) {
			t.Fatalf("parseURL(%q) = %+v", raw, loc)
		}
		if loc.endpoint != "" && !strings.HasPrefix(loc.endpoint, "http://") && !strings.HasPrefix(loc.endpoint, "https://") {
			t.Fatalf("parseURL(%q): endpoint %q", raw, loc.endpoint)
		}
	})
}

var scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// hasPassword reports whether raw, parsed or not, is a URL whose
// authority carries password.
func hasPassword(raw, password string) bool {
	if u, err := url.Parse(raw); err == nil {
		p, _ := u.User.Password()
		return p == password
	}
	if !scheme.MatchString(raw) {
		return false
	}
	_, rest, _ := strings.Cut(raw, "://")
	authority, _, _ := strings.Cut(rest, "/")
	return strings.Contains(authority, ":"+password+"@")
}
