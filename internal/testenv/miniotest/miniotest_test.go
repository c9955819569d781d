package miniotest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"
)

func TestMain(m *testing.M) { Main(m) }

func TestNew(t *testing.T) {
	b := New(t)
	if _, err := srv.client.HeadBucket(context.Background(), &s3.HeadBucketInput{Bucket: &b.Name}); err != nil {
		t.Errorf("the bucket %s: %v", b.Name, err)
	}
	if !strings.HasPrefix(b.URL, "s3://"+b.Name+"?endpoint=http://127.0.0.1:") || os.Getenv("AWS_ACCESS_KEY_ID") != AccessKey {
		t.Errorf("URL %s, AWS_ACCESS_KEY_ID %q", b.URL, os.Getenv("AWS_ACCESS_KEY_ID"))
	}
	if b2 := New(t); b2.Name == b.Name || b2.Endpoint != b.Endpoint {
		t.Errorf("a second bucket: %+v, after %+v", b2, b)
	}
}

func TestBucketName(t *testing.T) {
	for _, test := range []string{"TestX", "TestConformance/ListMany", strings.Repeat("Long_Name/", 20), "x"} {
		name := bucketName(test)
		if !validBucket.MatchString(name) {
			t.Errorf("bucketName(%q) = %q, not a bucket name", test, name)
		}
	}
}

// Without the binary a test skips, or fails under CI.
func TestMissingBinary(t *testing.T) {
	if os.Getenv("MINIOTEST_CHILD") != "" {
		New(t)
		return
	}
	for _, ci := range []string{"", "true"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingBinary$", "-test.v")
		cmd.Env = append(os.Environ(), "MINIOTEST_CHILD=1", "SBX_MINIO=/nonexistent/minio", "CI="+ci)
		out, err := cmd.CombinedOutput()
		want := "--- SKIP"
		if ci != "" {
			want = "--- FAIL"
		}
		if !strings.Contains(string(out), want) || !strings.Contains(string(out), "needs a MinIO server binary at /nonexistent/minio") || (err == nil) != (ci == "") {
			t.Errorf("CI=%q: %v, %s; want %s", ci, err, out, want)
		}
	}
}

// Start, for a program that is not a test, gives a bucket of the same
// server and sets the AWS environment; without the binary it says why.
func TestStart(t *testing.T) {
	SetEnv(t, "someone-else", "their-secret") // restored after the test
	b, err := Start("TestStart")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.client.HeadBucket(context.Background(), &s3.HeadBucketInput{Bucket: &b.Name}); err != nil {
		t.Errorf("the bucket %s: %v", b.Name, err)
	}
	if os.Getenv("AWS_ACCESS_KEY_ID") != AccessKey || os.Getenv("AWS_SECRET_ACCESS_KEY") != SecretKey {
		t.Errorf("AWS_ACCESS_KEY_ID %q after Start", os.Getenv("AWS_ACCESS_KEY_ID"))
	}
	t.Setenv("SBX_MINIO", "/nonexistent/minio")
	if _, err := Start("TestStart"); err == nil || !strings.Contains(err.Error(), "needs a MinIO server binary at /nonexistent/minio") {
		t.Errorf("without the binary: %v", err)
	}
}
