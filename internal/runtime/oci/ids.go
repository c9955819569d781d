package oci

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Every sandbox has host ids of its own: a range of UIDRange uids (and
// gids) starting at IDBase + slot*UIDRange, its root at the start. A
// process that escaped one sandbox is then a stranger to every other
// sandbox's processes and files, and a setuid file one sandbox leaves
// behind names nobody else.
//
// Files on disk, the template rootfs and the workspaces, keep one fixed
// owner range, the storage ids starting at UIDShift (template builds are
// shifted to it, the control plane writes workspace files as it). No
// sandbox runs as those. Each sandbox sees its rootfs and its workspace
// through idmapped mounts that show storage id UIDShift+n as its own
// base+n, so inside it everything looks as before (root and uid 1000) and
// what it writes lands on disk as storage ids again.
//
// A slot is claimed with a file in a host-wide directory (IDDir), made
// with O_EXCL, naming the sandbox's bundle: every sbx on the host, whatever
// its state directory, draws from the same slots. A claim whose bundle is
// gone (a crash between removing the bundle and the claim, a reboot) is
// free again; it is removed under an flock, so two processes cannot both
// find it stale.

// usernsHoldEnv makes a copy of this binary, started by usernsFor, wait
// until its standard input closes and exit: it is the process that holds
// a user namespace until the parent has opened it.
const usernsHoldEnv = "_SBX_OCI_USERNS_HOLD"

func init() {
	if os.Getenv(usernsHoldEnv) == "1" {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}
}

// idSlots hands out id slots and keeps, per slot, the user namespace that
// maps storage ids to the slot's range (an idmapped mount needs one).
type idSlots struct {
	dir     string // host-wide claims
	base    uint32 // first uid of slot 0
	size    uint32 // ids per slot
	count   int    // slots
	storage uint32 // first storage id

	mu     sync.Mutex
	userns map[int]int // slot -> open user namespace fd
	freed  []int       // slots this process released, whose userns it has
	next   int         // where the search for a never-used slot goes on
}

// claim takes a free slot for the sandbox whose bundle is b: one this
// process released before, whose user namespace is made already, else the
// next one after the last it took. Each try is one O_EXCL create, so a
// claim costs the same with thousands of sandboxes up.
func (s *idSlots) claim(b string) (int, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return 0, fmt.Errorf("id slots: %w", err)
	}
	s.mu.Lock()
	tries := append(slices.Clone(s.freed), -1)
	s.mu.Unlock()
	for _, n := range tries {
		if n < 0 {
			break
		}
		if ok, err := s.take(n, b); err != nil {
			return 0, err
		} else if ok {
			s.mu.Lock()
			s.freed = slices.DeleteFunc(s.freed, func(f int) bool { return f == n })
			s.mu.Unlock()
			return n, nil
		}
	}
	s.mu.Lock()
	start := s.next
	s.mu.Unlock()
	for i := 0; i < s.count; i++ {
		n := (start + i) % s.count
		ok, err := s.take(n, b)
		if err != nil {
			return 0, err
		}
		if ok {
			s.mu.Lock()
			s.next = (n + 1) % s.count
			s.mu.Unlock()
			return n, nil
		}
	}
	return 0, fmt.Errorf("all %d sandbox id ranges are in use: %w", s.count, errdefs.ErrUnavailable)
}

// take claims slot n for bundle b if it is free, or held by a claim whose
// bundle is gone.
func (s *idSlots) take(n int, b string) (bool, error) {
	p := filepath.Join(s.dir, strconv.Itoa(n))
	for attempt := 0; attempt < 2; attempt++ {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err == nil {
			_, werr := f.WriteString(b)
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				os.Remove(p)
				return false, fmt.Errorf("id slots: %w", werr)
			}
			return true, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return false, fmt.Errorf("id slots: %w", err)
		}
		if attempt > 0 || !s.dropStale(p) {
			return false, nil
		}
	}
	return false, nil
}

// dropStale removes the claim at p if its bundle is gone, under the
// claims' lock, so that two processes cannot both find it stale and one
// remove the other's new claim. It reports whether it removed it.
func (s *idSlots) dropStale(p string) bool {
	owner, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	if _, err := os.Stat(string(owner)); !errors.Is(err, os.ErrNotExist) {
		return false
	}
	lock, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false
	}
	defer lock.Close()
	if unix.Flock(int(lock.Fd()), unix.LOCK_EX) != nil {
		return false
	}
	// Under the lock, the claim must still be the stale one.
	if again, err := os.ReadFile(p); err != nil || string(again) != string(owner) {
		return false
	}
	return os.Remove(p) == nil
}

// release frees slot n if the sandbox whose bundle is b holds it.
func (s *idSlots) release(n int, b string) error {
	p := filepath.Join(s.dir, strconv.Itoa(n))
	owner, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("id slots: %w", err)
	}
	if string(owner) != b {
		return nil // taken again by another sandbox after a stale claim was freed
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("id slots: %w", err)
	}
	s.mu.Lock()
	if _, ok := s.userns[n]; ok {
		s.freed = append(s.freed, n)
	}
	s.mu.Unlock()
	return nil
}

// hostBase is the first host uid of slot n.
func (s *idSlots) hostBase(n int) uint32 { return s.base + uint32(n)*s.size }

// usernsFor returns a user namespace (an open fd, kept for reuse) that
// maps the storage ids to slot n's range, for idmapped mounts.
func (s *idSlots) usernsFor(n int) (int, error) {
	s.mu.Lock()
	fd, ok := s.userns[n]
	s.mu.Unlock()
	if ok {
		return fd, nil
	}
	fd, err := s.makeUserns(n)
	if err != nil {
		return -1, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if have, ok := s.userns[n]; ok { // made meanwhile by a claim of the same slot
		unix.Close(fd)
		return have, nil
	}
	if s.userns == nil {
		s.userns = map[int]int{}
	}
	s.userns[n] = fd
	return fd, nil
}

// makeUserns makes a user namespace that maps the storage ids to slot
// n's range and returns an fd of it.
func (s *idSlots) makeUserns(n int) (int, error) {
	// A user namespace needs a process to be made in: a copy of this
	// binary that only waits (see init). Its maps are written before it
	// runs, and the namespace outlives it through the fd.
	self, err := os.Executable()
	if err != nil {
		return -1, fmt.Errorf("id slots: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Env = []string{usernsHoldEnv + "=1"}
	cmd.Stdout, cmd.Stderr = nil, nil
	m := []syscall.SysProcIDMap{{ContainerID: int(s.storage), HostID: int(s.hostBase(n)), Size: int(s.size)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m}
	hold, err := cmd.StdinPipe()
	if err != nil {
		return -1, fmt.Errorf("id slots: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("id slots: a user namespace for the idmapped mounts: %w", err)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	hold.Close()
	if werr := cmd.Wait(); err == nil && werr != nil {
		unix.Close(fd)
		err = werr
	}
	if err != nil {
		return -1, fmt.Errorf("id slots: a user namespace for the idmapped mounts: %w", err)
	}
	return fd, nil
}

// slotFromRecord is the id slot a sandbox's record names, or -1.
func slotFromRecord(rec *record) int {
	if rec.IDBase == 0 {
		return -1 // made before sandboxes had ids of their own
	}
	return rec.IDSlot
}

// idmapError explains an idmapped mount the kernel or file system refused.
func idmapError(what, path string, err error) error {
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("%s %s: an idmapped mount was refused (%v): sandboxes need Linux 5.12 or later and a file system that supports them (ext4, xfs, btrfs, tmpfs): %w",
			what, path, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s %s: %w", what, path, err)
}
