// Package miniotest gives tests a real S3 API: a MinIO server that the
// test process starts on first use, on free loopback ports with its data
// in a temporary directory, and stops when the tests end (Main). Each
// test gets a fresh bucket.
//
// MinIO is AGPL-licensed. sbx only runs it, as a separate process, in
// tests; no sbx package imports it. scripts/setup.sh builds the binary
// (from the Go module proxy, at a pinned version) to DefaultBinary;
// SBX_MINIO names another. Without it tests skip, or fail under CI
// (CI set), which must run them. A program that is not a test (bench/)
// uses Start and Stop.
package miniotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"go.uber.org/goleak"
)

// DefaultBinary is where scripts/setup.sh installs MinIO.
const DefaultBinary = "/usr/local/lib/sbx-test/minio"

// The server's root credentials, which every test bucket is reached with.
const (
	AccessKey = "sbx-test"
	SecretKey = "sbx-test-secret"
	Region    = "us-east-1"
)

// Binary is the MinIO binary tests run: $SBX_MINIO, else DefaultBinary.
func Binary() string {
	if p := os.Getenv("SBX_MINIO"); p != "" {
		return p
	}
	return DefaultBinary
}

// Bucket is a fresh, empty bucket of the test process's MinIO.
type Bucket struct {
	Name string
	// Endpoint is MinIO's S3 API, http://127.0.0.1:PORT.
	Endpoint string
	// URL is the bucket as a blob store URL (s3.Open):
	// s3://NAME?endpoint=ENDPOINT&region=us-east-1.
	URL string
}

// New starts MinIO if this process has not yet, makes a bucket for t, and
// sets the standard AWS environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_REGION) to MinIO's credentials for the
// length of t, with the shared config files and the instance metadata
// service out of the way. t.Setenv: t and its parents must not be
// parallel. Without a MinIO binary it skips t, or fails it under CI.
func New(t testing.TB) *Bucket {
	t.Helper()
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		why := fmt.Sprintf("needs a MinIO server binary at %s (scripts/setup.sh builds it; or set SBX_MINIO): %v", bin, err)
		if os.Getenv("CI") != "" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	once.Do(func() { srv, startErr = start(bin) })
	if startErr != nil {
		t.Fatalf("minio: %v", startErr)
	}
	SetEnv(t, AccessKey, SecretKey)
	b, err := newBucket(bucketName(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// newBucket makes a bucket on the running MinIO.
func newBucket(name string) (*Bucket, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := srv.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: &name}); err != nil {
		return nil, fmt.Errorf("minio: creating bucket %s: %w", name, err)
	}
	return &Bucket{
		Name:     name,
		Endpoint: srv.endpoint,
		URL:      fmt.Sprintf("s3://%s?endpoint=%s&region=%s", name, srv.endpoint, Region),
	}, nil
}

// Start is New for a program that is not a test (a benchmark): it starts
// this process's MinIO if it has not yet, sets the process's AWS
// environment to MinIO's credentials for good (as SetEnv does for a
// test), and makes a fresh bucket whose name starts with name. The
// program must call Stop. Without a MinIO binary it fails, saying so.
func Start(name string) (*Bucket, error) {
	bin := Binary()
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("needs a MinIO server binary at %s (scripts/setup.sh builds it; or set SBX_MINIO): %w", bin, err)
	}
	once.Do(func() { srv, startErr = start(bin) })
	if startErr != nil {
		return nil, fmt.Errorf("minio: %w", startErr)
	}
	if srv == nil {
		return nil, errors.New("minio: stopped")
	}
	setEnv(func(k, v string) { os.Setenv(k, v) }, func(k string) { os.Unsetenv(k) }, AccessKey, SecretKey)
	return newBucket(bucketName(name))
}

// SetEnv sets the standard AWS environment to the credentials given for
// the length of t, and unsets or points away whatever else of the
// developer's AWS setup would change what an SDK client does (a profile,
// a session token, an endpoint, the metadata service).
func SetEnv(t testing.TB, accessKey, secretKey string) {
	t.Helper()
	setEnv(t.Setenv, func(k string) {
		t.Setenv(k, "") // restored after t
		os.Unsetenv(k)
	}, accessKey, secretKey)
}

func setEnv(set func(k, v string), unset func(k string), accessKey, secretKey string) {
	set("AWS_ACCESS_KEY_ID", accessKey)
	set("AWS_SECRET_ACCESS_KEY", secretKey)
	set("AWS_REGION", Region)
	set("AWS_EC2_METADATA_DISABLED", "true")
	none := filepath.Join(os.TempDir(), "sbx-miniotest-no-such-file")
	set("AWS_CONFIG_FILE", none)
	set("AWS_SHARED_CREDENTIALS_FILE", none)
	for _, k := range []string{"AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"} {
		unset(k)
	}
}

var (
	once     sync.Once
	srv      *server
	startErr error
	buckets  atomic.Int64
)

var (
	notBucket   = regexp.MustCompile(`[^a-z0-9]+`)
	validBucket = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$`)
)

// bucketName is a bucket name unique in the process that says which test
// it is for.
func bucketName(test string) string {
	name := fmt.Sprintf("t%d-%s", buckets.Add(1), strings.Trim(notBucket.ReplaceAllString(strings.ToLower(test), "-"), "-"))
	return strings.TrimRight(name[:min(len(name), 63)], "-")
}

// server is the running MinIO.
type server struct {
	cmd      *exec.Cmd
	exited   chan struct{} // closed once the process has exited
	root     string        // its data and log
	endpoint string
	client   *s3.Client
	http     *http.Client
}

// start starts MinIO on free ports, a few times if another process takes
// a port meanwhile.
func start(bin string) (*server, error) {
	var err error
	for range 3 {
		var s *server
		if s, err = startOnce(bin); err == nil {
			return s, nil
		}
	}
	return nil, err
}

func startOnce(bin string) (*server, error) {
	removeStale()
	root, err := os.MkdirTemp("", "sbx-minio-")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(root, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	log, err := os.Create(filepath.Join(root, "minio.log"))
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(bin, "server", "--quiet",
		"--address", addr, "--console-address", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		filepath.Join(root, "data"))
	cmd.Env = append(environ(),
		"MINIO_ROOT_USER="+AccessKey,
		"MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
	)
	cmd.Stdout, cmd.Stderr = log, log
	// MinIO dies with the test process, however that ends (a panic, a
	// timeout, a kill): the signal comes when the thread that started it
	// exits, so that thread is held until MinIO has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	s := &server{cmd: cmd, exited: make(chan struct{}), root: root, endpoint: "http://" + addr}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(s.exited)
	}()
	if err := <-started; err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	if err := s.waitLive(60 * time.Second); err != nil {
		s.stop()
		b, _ := os.ReadFile(log.Name())
		os.RemoveAll(root)
		return nil, fmt.Errorf("%s: %w; its log: %s", bin, err, bytes.TrimSpace(b))
	}
	s.http = &http.Client{Transport: &http.Transport{}}
	s.client = s3.New(s3.Options{
		HTTPClient:   s.http,
		Region:       Region,
		BaseEndpoint: aws.String(s.endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
	return s, nil
}

// removeStale removes the data of MinIOs whose test process died without
// removing it (a panic, a timeout, a kill: MinIO itself died with it).
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "sbx-minio-*"))
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "owner"))
		if err != nil {
			continue // being made, or not one of ours
		}
		if pid, err := strconv.Atoi(string(b)); err == nil && syscall.Kill(pid, 0) == syscall.ESRCH {
			os.RemoveAll(dir)
		}
	}
}

// environ is the process's environment less AWS's and MinIO's settings.
func environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") && !strings.HasPrefix(kv, "MINIO_") {
			env = append(env, kv)
		}
	}
	return env
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitLive waits for MinIO's liveness probe to answer 200.
func (s *server) waitLive(timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(timeout)
	for {
		resp, err := client.Get(s.endpoint + "/minio/health/live")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not live after %v: %v", timeout, err)
		}
		select {
		case <-s.exited:
			return fmt.Errorf("exited: %v", s.cmd.ProcessState)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop ends MinIO: SIGTERM, then SIGKILL if it has not exited in 10 s.
func (s *server) stop() {
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// M is a *testing.M.
type M interface{ Run() int }

// WithServer wraps a TestMain's m so that MinIO, if a test started it,
// is stopped and its data removed after the tests:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(miniotest.WithServer(m)) }
func WithServer(m M) M { return serverM{m} }

type serverM struct{ m M }

func (s serverM) Run() int {
	defer Stop()
	return s.m.Run()
}

// Stop stops MinIO if it runs and removes its data. WithServer and Main
// call it.
func Stop() {
	if srv == nil {
		return
	}
	srv.http.CloseIdleConnections()
	srv.stop()
	os.RemoveAll(srv.root)
	srv = nil
}

// Main is a TestMain for the tests of a package that uses MinIO: it runs
// them, stops MinIO, then fails if a goroutine leaked (goleak).
func Main(m *testing.M) { goleak.VerifyTestMain(WithServer(m)) }
