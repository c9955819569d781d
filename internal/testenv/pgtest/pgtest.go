// Package pgtest gives tests a real, throwaway PostgreSQL: one cluster per
// test process, made by initdb in a temporary directory and started on
// first use, and a fresh empty database per call of URL. It never touches
// a system cluster: the cluster listens on 127.0.0.1 on a free port and
// keeps its socket in its own directory.
//
// A package that uses it runs its tests through Main or WithCluster, which
// stop the cluster and remove its directory when the tests end:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.WithCluster(m)) }
//
// When the test process dies without that (a panic, a -timeout, a kill),
// the kernel stops the cluster with it: postgres runs with a parent-death
// signal.
//
// PostgreSQL refuses to run as root; as root, pgtest runs initdb and
// postgres as the postgres system user (the Debian package makes it), else
// as nobody. Without the binaries tests skip, and fail under CI (the CI
// environment variable set), which must have them: scripts/setup.sh
// installs them.
//
// A program that is not a test (bench/) starts a cluster of its own with
// Start and stops it itself.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// M is what TestMain receives (and goleak.VerifyTestMain takes).
type M interface{ Run() int }

// WithCluster wraps m so that the process's cluster, if a test started
// it, is stopped and removed after the tests, even when they fail.
func WithCluster(m M) M { return clusterM{m} }

// Main runs the tests through WithCluster and exits with their result.
func Main(m M) { os.Exit(WithCluster(m).Run()) }

type clusterM struct{ m M }

func (c clusterM) Run() int {
	running.Store(true)
	code := c.m.Run()
	running.Store(false)
	if shared != nil {
		if err := shared.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

var (
	running atomic.Bool // inside WithCluster's Run
	once    sync.Once
	shared  *cluster
	initErr error
)

// Require skips the test when this machine has no PostgreSQL server
// binaries, or fails it under CI, which must have them.
func Require(t testing.TB) {
	t.Helper()
	if _, _, err := findBinaries(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// URL returns the URL of a fresh, empty database on the process's cluster,
// starting the cluster on first use. The database is dropped when the test
// ends; that fails the test if a connection to it is still open (a store
// the test did not close).
func URL(t testing.TB) string {
	t.Helper()
	Require(t)
	if !running.Load() {
		t.Fatal("pgtest: run the package's tests through pgtest.Main or pgtest.WithCluster (in TestMain), which stop the cluster")
	}
	once.Do(func() { shared, initErr = start() })
	if initErr != nil {
		t.Fatalf("pgtest: %v", initErr)
	}
	c := shared
	name := fmt.Sprintf("test_%d", c.dbs.Add(1))
	if err := c.admin("CREATE DATABASE " + name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		// Not WITH (FORCE): a connection left open is a leak to report.
		// DROP waits a few seconds for closed ones to go away.
		if err := c.admin("DROP DATABASE " + name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return c.url(name)
}

// Available says why this machine cannot run a cluster (its PostgreSQL
// server binaries are missing), nil if it can.
func Available() error {
	_, _, err := findBinaries()
	return err
}

// Cluster is a throwaway cluster for a program that is not a test (a
// benchmark): Start makes it, NewDatabase gives databases on it, and the
// program must Stop it. It is the cluster tests get, with the same
// settings (speed over durability: fsync and synchronous_commit off), but
// its own, not the test process's shared one. If the program dies without
// stopping it, postgres dies with it (the parent-death signal), leaving
// its temporary directory behind.
type Cluster struct{ c *cluster }

// Start makes and starts a cluster of its own; Available says beforehand
// whether it can.
func Start() (*Cluster, error) {
	c, err := start()
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	return &Cluster{c}, nil
}

// NewDatabase makes a fresh, empty database on the cluster and returns its
// URL. It lives as long as the cluster.
func (c *Cluster) NewDatabase() (string, error) {
	name := fmt.Sprintf("db_%d", c.c.dbs.Add(1))
	if err := c.c.admin("CREATE DATABASE " + name); err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	return c.c.url(name), nil
}

// Stop shuts the cluster down and removes its directory.
func (c *Cluster) Stop() error { return c.c.stop() }

// cluster is a running postmaster and what it takes to reach it.
type cluster struct {
	dir      string // everything: data, socket, log, password file
	port     int
	password string // of the superuser postgres, over TCP
	cmd      *exec.Cmd
	done     chan struct{} // closed when postgres has exited
	waitErr  error         // why, once done is closed

	mu   sync.Mutex
	conn *pgx.Conn // to the postgres database, for CREATE and DROP DATABASE
	dbs  atomic.Int64
}

// startTimeout bounds initdb and the wait for the server to accept
// connections; stopTimeout, the fast shutdown.
const (
	startTimeout = 2 * time.Minute
	stopTimeout  = 30 * time.Second
)

func (c *cluster) url(db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword("postgres", c.password),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

func (c *cluster) admin(sql string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("%s: %w", sql, err)
	}
	return nil
}

// findBinaries returns the paths of initdb and postgres: of the newest
// version in Debian's /usr/lib/postgresql/VERSION/bin, else from PATH.
func findBinaries() (initdb, postgres string, err error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(versionOf(b), versionOf(a)) })
	for _, d := range dirs {
		i, p := filepath.Join(d, "initdb"), filepath.Join(d, "postgres")
		if isExecutable(i) && isExecutable(p) {
			return i, p, nil
		}
	}
	i, err1 := exec.LookPath("initdb")
	p, err2 := exec.LookPath("postgres")
	if err1 != nil || err2 != nil {
		return "", "", errors.New("PostgreSQL server binaries (initdb, postgres) not in /usr/lib/postgresql/*/bin or PATH " +
			"(apt-get install postgresql; scripts/setup.sh does)")
	}
	return i, p, nil
}

// versionOf returns the VERSION of /usr/lib/postgresql/VERSION/bin.
func versionOf(binDir string) string { return filepath.Base(filepath.Dir(binDir)) }

// compareVersions orders dotted versions ("9.6" < "15"); what is not a
// number sorts first.
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		na, nb := -1, -1
		if i < len(pa) {
			if n, err := strconv.Atoi(pa[i]); err == nil {
				na = n
			}
		}
		if i < len(pb) {
			if n, err := strconv.Atoi(pb[i]); err == nil {
				nb = n
			}
		}
		if na != nb {
			return na - nb
		}
	}
	return 0
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// majorVersion runs "initdb --version" ("initdb (PostgreSQL) 15.18 ...").
func majorVersion(initdb string) (int, error) {
	out, err := exec.Command(initdb, "--version").Output()
	if err != nil {
		return 0, fmt.Errorf("%s --version: %w", initdb, err)
	}
	_, v, ok := strings.Cut(string(out), ") ")
	v, _, _ = strings.Cut(v, ".")
	n, err := strconv.Atoi(strings.TrimFunc(v, func(r rune) bool { return r < '0' || r > '9' }))
	if !ok || err != nil {
		return 0, fmt.Errorf("%s --version: cannot read %q", initdb, out)
	}
	return n, nil
}

// serverUser returns the credential to run initdb and postgres with: nil
// (this process's own) unless this process is root.
func serverUser() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		// Groups empty: none of root's supplementary groups.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, errors.New("running as root and there is neither a postgres nor a nobody user to run PostgreSQL as (it refuses root)")
}

// start makes and starts the cluster.
func start() (_ *cluster, err error) {
	initdb, postgres, err := findBinaries()
	if err != nil {
		return nil, err
	}
	major, err := majorVersion(initdb)
	if err != nil {
		return nil, err
	}
	cred, err := serverUser()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sbx-pgtest-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	pw := make([]byte, 16)
	rand.Read(pw)
	c := &cluster{dir: dir, password: hex.EncodeToString(pw)}
	pwfile, sock := filepath.Join(dir, "password"), filepath.Join(dir, "sock")
	if err := os.WriteFile(pwfile, []byte(c.password+"\n"), 0o600); err != nil {
		return nil, err
	}
	if err := os.Mkdir(sock, 0o700); err != nil {
		return nil, err
	}
	if cred != nil {
		for _, p := range []string{dir, pwfile, sock} {
			if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
				return nil, err
			}
		}
	}

	data := filepath.Join(dir, "data")
	args := []string{"-D", data, "-U", "postgres", "--pwfile", pwfile, "-E", "UTF8",
		// TCP (what tests use) needs the password; the socket, in a
		// directory only the server's user can enter, does not.
		"--auth-host=scram-sha-256", "--auth-local=trust",
		"--no-sync"} // a throwaway cluster
	if major >= 15 {
		// Production databases mostly collate as glibc's en_US does,
		// ignoring punctuation at first ("a.txt" after "a/b/c"), unlike
		// byte order. So does this cluster's default collation (ICU's
		// "shifted" punctuation), so that a query that relies on the
		// database's collation for byte order fails here too.
		args = append(args, "--locale=C", "--locale-provider=icu", "--icu-locale=en-US-u-ka-shifted")
	} else {
		args = append(args, "--locale=C")
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, initdb, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, bytes.TrimSpace(out))
	}

	// A free port can be taken between finding it and postgres binding
	// it: try another.
	for attempt := 0; ; attempt++ {
		if c.port, err = freePort(); err != nil {
			return nil, err
		}
		err = c.run(ctx, postgres, data, sock, cred)
		if err == nil || attempt == 2 || !errors.Is(err, errPortTaken) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	return c, nil
}

var errPortTaken = errors.New("port taken")

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// run starts postgres and waits until it accepts connections.
func (c *cluster) run(ctx context.Context, postgres, data, sock string, cred *syscall.Credential) error {
	logPath := filepath.Join(c.dir, "postgres.log")
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer log.Close() // postgres has its own copy
	c.cmd = exec.Command(postgres, "-D", data,
		"-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-k", sock,
		// Speed over durability: the cluster dies with the test.
		"-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off",
		"-c", "autovacuum=off",
		// Dynamic shared memory in the data directory, not /dev/shm:
		// removed with it whatever happens.
		"-c", "dynamic_shared_memory_type=mmap",
		"-c", "logging_collector=off")
	c.cmd.Stdout, c.cmd.Stderr = log, log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: cred,
		// Own process group: a ^C in the terminal reaches the tests,
		// which then stop the cluster, not postgres directly.
		Setpgid: true,
		// If this process dies without stopping it: an immediate
		// shutdown, which takes the backends with it.
		Pdeathsig: syscall.SIGQUIT,
	}
	c.done = make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// The parent-death signal is sent when the thread that started
		// postgres exits, not the process: keep this goroutine on its
		// thread until postgres exits. The thread dies with it (it stays
		// locked), which is then harmless.
		runtime.LockOSThread()
		if err := c.cmd.Start(); err != nil {
			started <- err
			close(c.done)
			return
		}
		started <- nil
		c.waitErr = c.cmd.Wait()
		close(c.done)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("starting postgres: %w", err)
	}

	admin := c.url("postgres")
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(attempt, admin)
		cancel()
		if err == nil {
			c.conn = conn
			return nil
		}
		select {
		case <-c.done:
			out, _ := os.ReadFile(logPath)
			err := fmt.Errorf("postgres exited at start: %v: %s", c.waitErr, lastLines(out, 10))
			if bytes.Contains(out, []byte("could not create any TCP/IP sockets")) {
				err = fmt.Errorf("%w: %w", errPortTaken, err)
			}
			return err
		case <-ctx.Done():
			c.kill()
			out, _ := os.ReadFile(logPath)
			return fmt.Errorf("postgres did not accept connections within %v: %v: %s", startTimeout, err, lastLines(out, 10))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// stop shuts the cluster down (fast: the backends are told to exit at
// once) and removes its directory.
func (c *cluster) stop() error {
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c.conn.Close(ctx)
		cancel()
	}
	var err error
	if c.cmd.Process.Signal(syscall.SIGINT) == nil {
		select {
		case <-c.done:
		case <-time.After(stopTimeout):
			err = fmt.Errorf("postgres (pid %d) did not stop within %v; killed it", c.cmd.Process.Pid, stopTimeout)
			c.kill()
		}
	}
	return errors.Join(err, os.RemoveAll(c.dir))
}

// kill ends postgres at once (its backends exit when they see it gone)
// and waits for it.
func (c *cluster) kill() {
	c.cmd.Process.Kill()
	<-c.done
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
