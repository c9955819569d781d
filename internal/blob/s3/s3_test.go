package s3_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/blobtest"
	"github.com/sbx-sandbox/sbx/internal/blob/s3"
	"github.com/sbx-sandbox/sbx/internal/testenv/miniotest"
)

func TestMain(m *testing.M) { miniotest.Main(m) }

var ctx = context.Background()

func open(t *testing.T, url string) *s3.Store {
	t.Helper()
	s, err := s3.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store { return open(t, miniotest.New(t).URL) })
}

// A store with a prefix keeps its blobs under it, and sees no others.
func TestPrefix(t *testing.T) {
	b := miniotest.New(t)
	withPrefix := open(t, strings.Replace(b.URL, b.Name, b.Name+"/pre/fix/", 1))
	whole := open(t, b.URL)
	whole.Put(ctx, "pre/other", strings.NewReader("not under the prefix"))
	if _, err := withPrefix.Put(ctx, "k", strings.NewReader("v")); err != nil {
		t.Fatal(err)
	}
	if info, err := whole.Stat(ctx, "pre/fix/k"); err != nil || info.Size != 1 {
		t.Errorf("the blob in the bucket: %+v, %v", info, err)
	}
	if l, err := blobtest.List(ctx, withPrefix, ""); err != nil || len(l) != 1 || l[0].Key != "k" {
		t.Errorf("List under the prefix: %+v, %v", l, err)
	}
	if err := withPrefix.Ping(ctx); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// Open fails on one line that says what is wrong, in the category of it.
func TestOpenErrors(t *testing.T) {
	b := miniotest.New(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	for _, c := range []struct {
		name, url string
		creds     []string // access key and secret, if not MinIO's
		is        error
		says      string
	}{
		{"scheme", "http://bucket/x", nil, errdefs.ErrInvalidArgument, "the scheme is not s3"},
		{"no bucket name", "s3:///x", nil, errdefs.ErrInvalidArgument, "is not a bucket name"},
		{"bad bucket name", "s3://Bad_Bucket", nil, errdefs.ErrInvalidArgument, "is not a bucket name"},
		{"bad prefix", "s3://bucket/a//../b", nil, errdefs.ErrInvalidArgument, "is not a blob key"},
		{"credentials in the URL", "s3://key:secret@bucket", nil, errdefs.ErrInvalidArgument, "credentials do not go in the URL"},
		{"unknown parameter", "s3://bucket?endpiont=http://x", nil, errdefs.ErrInvalidArgument, `unknown parameter "endpiont"`},
		{"bad endpoint", "s3://bucket?endpoint=127.0.0.1:9000", nil, errdefs.ErrInvalidArgument, "is not an http:// or https:// URL"},
		{"unreachable", fmt.Sprintf("s3://%s?endpoint=%s", b.Name, closed), nil, errdefs.ErrUnavailable, "connection refused"},
		{"wrong secret", b.URL, []string{miniotest.AccessKey, "not-the-secret"}, errdefs.ErrFailedPrecondition, "SignatureDoesNotMatch"},
		{"unknown key", b.URL, []string{"nobody", miniotest.SecretKey}, errdefs.ErrFailedPrecondition, "InvalidAccessKeyId"},
		{"no credentials", b.URL, []string{"", ""}, errdefs.ErrFailedPrecondition, "no AWS credentials"},
		{"no such bucket", strings.Replace(b.URL, b.Name, "no-such-bucket", 1), nil, errdefs.ErrNotFound, "no such bucket"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.creds != nil {
				miniotest.SetEnv(t, c.creds[0], c.creds[1])
			}
			_, err := s3.Open(ctx, c.url)
			if !errors.Is(err, c.is) || !strings.Contains(fmt.Sprint(err), c.says) || strings.Contains(fmt.Sprint(err), "\n") {
				t.Errorf("Open(%s) = %v; want one line with %q, %v", c.url, err, c.says, c.is)
			}
			if strings.Contains(fmt.Sprint(err), "secret@") {
				t.Errorf("the error shows the URL's password: %v", err)
			}
			t.Log(err)
		})
	}
}

// A reader reads the version of the blob it opened: through its first
// GET, or, when it must make another, failing rather than mixing two.
func TestReaderOfReplacedBlob(t *testing.T) {
	s := open(t, miniotest.New(t).URL)
	s.Put(ctx, "k", strings.NewReader("first version"))
	r, err := s.Open(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s.Put(ctx, "k", strings.NewReader("second version"))
	if b, err := io.ReadAll(r); string(b) != "first version" || err != nil {
		t.Errorf("the opened blob after a replace: %q, %v", b, err)
	}
	r.Seek(6, io.SeekStart)
	if b, err := io.ReadAll(r); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a new read after a replace: %q, %v; want ErrUnavailable", b, err)
	}
	s.Delete(ctx, "k")
	r.Seek(6, io.SeekStart)
	if b, err := io.ReadAll(r); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a new read after a delete: %q, %v; want ErrNotFound", b, err)
	}
}
