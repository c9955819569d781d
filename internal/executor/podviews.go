package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
)

// Conversation views in the unprivileged mode (a Pod). Under runc a run of
// conversation C sees its own uploads at uploads/temparea through mounts
// in its worker's mount namespace (worker.py's conversation_view). A Pod's
// executor can make no mounts, so here the same path is made of two plain
// file system mechanisms:
//
//   - Access is by group. Each conversation gets a group id of its own for
//     the executor's life (podViews.gids), and everything under
//     uploads/C is root's, of that group, 0750 (directories) or 0640
//     (files); uploads itself is 0711. A run of C gets C's group as its
//     one supplementary group (worker.py's drop_privileges) and so reads
//     C's uploads; a run of another conversation, or of none, reads no
//     conversation's uploads, not even through another process's
//     /proc/PID/cwd or /proc/PID/fd, since every directory and file on
//     the way checks the group.
//   - The path is a symbolic link, uploads/temparea -> C/temparea, that
//     the executor points at the conversation whose runs are under way.
//     One link serves one conversation at a time, so runs of different
//     conversations take turns (podViews.enter); runs of one conversation,
//     and runs of none, go on side by side.
//
// The groups are the executor's and not kept in the workspace: a new Pod
// gives every conversation a new group as it starts (own).
type podViews struct {
	dir string // the workspace

	mu      sync.Mutex
	current string        // the conversation uploads/temparea leads to
	active  int           // runs of current under way
	idle    chan struct{} // closed (and replaced) when active drops to 0
	gids    map[string]int
	next    int
}

// The conversations' group ids: within the 65536 ids a Pod's user
// namespace maps (hostUsers: false), above any a template's image names.
const (
	viewGIDFirst = 40000
	viewGIDEnd   = 65000
)

// viewLink is the name of the link in uploads, and so a name no
// conversation may have in this mode.
const viewLink = "temparea"

// Modes of what is under uploads/C: the group reads, others nothing.
const (
	viewDirMode  = 0o750
	viewFileMode = 0o640
	uploadsPod   = 0o711 // traversed by all, listed by none
)

// maxViewDepth bounds the walk of a conversation's uploads.
const maxViewDepth = 256

func newPodViews(dir string) *podViews {
	return &podViews{dir: dir, idle: make(chan struct{}), gids: map[string]int{}, next: viewGIDFirst}
}

// checkConversation refuses what cannot be a conversation here.
func checkConversation(conv string) error {
	if !wire.ValidConversationID(conv) {
		return fmt.Errorf("conversation %q: not a valid conversation id: %w", conv, errdefs.ErrInvalidArgument)
	}
	if conv == viewLink {
		return fmt.Errorf("conversation %q: in a Pod, uploads/%s is where a run finds its conversation's uploads; the name cannot be a conversation's: %w",
			conv, viewLink, errdefs.ErrInvalidArgument)
	}
	return nil
}

// enter waits, at most wait, until no run of another conversation is under
// way, points uploads/temparea at conv's uploads and returns conv's group.
// release must be called once the run is over, its processes gone.
func (v *podViews) enter(ctx context.Context, conv string, wait time.Duration) (gid int, release func(), err error) {
	if err := checkConversation(conv); err != nil {
		return 0, nil, err
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		v.mu.Lock()
		if v.active == 0 || v.current == conv {
			break
		}
		idle, other := v.idle, v.current
		v.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return 0, nil, context.Cause(ctx)
		case <-t.C:
			return 0, nil, fmt.Errorf("conversation %q: runs of conversation %q held uploads/%s for the whole timeout (in a Pod, runs of different conversations take turns): %w",
				conv, other, viewLink, errdefs.ErrUnavailable)
		}
	}
	defer v.mu.Unlock()
	if gid, err = v.groupLocked(conv); err != nil {
		return 0, nil, err
	}
	if v.current != conv {
		if err := withFileCapsDo(func() error { return v.point(conv) }); err != nil {
			return 0, nil, err
		}
		v.current = conv
	}
	v.active++
	return gid, sync.OnceFunc(func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.active--; v.active == 0 {
			close(v.idle)
			v.idle = make(chan struct{})
		}
	}), nil
}

// own gives conv's uploads (made if missing) their group and modes: after
// an upload, say.
func (v *podViews) own(conv string) error {
	if err := checkConversation(conv); err != nil {
		return err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	gid, ok := v.gids[conv]
	if !ok {
		_, err := v.groupLocked(conv) // owns it too
		return err
	}
	return withFileCapsDo(func() error { return v.ownTree(conv, gid) })
}

// ownAll closes uploads to all but root and owns every conversation's
// uploads: on start, and after the workspace was replaced (an import).
func (v *podViews) ownAll() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return withFileCapsDo(func() error {
		up, err := v.openUploads()
		if err != nil {
			return err
		}
		defer up.Close()
		if err := up.Chmod(uploadsPod); err != nil {
			return fmt.Errorf("uploads: %w", err)
		}
		ents, err := up.ReadDir(-1)
		if err != nil {
			return fmt.Errorf("uploads: %w", err)
		}
		for _, e := range ents {
			if !e.IsDir() || checkConversation(e.Name()) != nil {
				continue // the link, or what sbx never made
			}
			gid, ok := v.gids[e.Name()]
			if !ok {
				if gid, err = v.allocLocked(e.Name()); err != nil {
					return err
				}
			}
			if err := v.ownTree(e.Name(), gid); err != nil {
				return err
			}
		}
		return nil
	})
}

// groupLocked returns conv's group, giving it one (and its uploads that
// group) the first time.
func (v *podViews) groupLocked(conv string) (int, error) {
	if gid, ok := v.gids[conv]; ok {
		return gid, nil
	}
	gid, err := v.allocLocked(conv)
	if err != nil {
		return 0, err
	}
	if err := withFileCapsDo(func() error { return v.ownTree(conv, gid) }); err != nil {
		delete(v.gids, conv) // owned again next time
		return 0, err
	}
	return gid, nil
}

func (v *podViews) allocLocked(conv string) (int, error) {
	if v.next >= viewGIDEnd {
		return 0, fmt.Errorf("conversation %q: this sandbox has given %d conversations a group, the most it can; a new sandbox starts again: %w",
			conv, viewGIDEnd-viewGIDFirst, errdefs.ErrResourceExhausted)
	}
	gid := v.next
	v.next++
	v.gids[conv] = gid
	return gid, nil
}

// openUploads opens the workspace's uploads directory, which must be
// root's and writable by root alone: sandboxed code owns the workspace and
// may have renamed the real one away and made its own.
func (v *podViews) openUploads() (*os.File, error) {
	ws, err := unix.Open(v.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("workspace: %w: %w", err, errdefs.ErrUnavailable)
	}
	defer unix.Close(ws)
	fd, err := unix.Openat(ws, "uploads", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("uploads: %w: %w", err, errdefs.ErrUnavailable)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Uid != 0 || st.Mode&0o022 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("uploads is not the directory sbx made (sandboxed code replaced it); a new sandbox puts it back: %w", errdefs.ErrUnavailable)
	}
	return os.NewFile(uintptr(fd), "uploads"), nil
}

// ownTree makes uploads/conv/temparea if missing and gives everything
// under uploads/conv root, gid and the view's modes, following no link.
func (v *podViews) ownTree(conv string, gid int) error {
	up, err := v.openUploads()
	if err != nil {
		return err
	}
	defer up.Close()
	upfd := int(up.Fd())
	if err := unix.Mkdirat(upfd, conv, viewDirMode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("uploads/%s: %w", conv, err)
	}
	c, err := openNoFollow(upfd, conv)
	if err != nil {
		return fmt.Errorf("uploads/%s: %w", conv, err)
	}
	defer c.Close()
	if err := unix.Mkdirat(int(c.Fd()), viewLink, viewDirMode); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("uploads/%s/%s: %w", conv, viewLink, err)
	}
	return ownWalk(c, "uploads/"+conv, gid, 0)
}

// openNoFollow opens name in dir without following a link (ELOOP) or
// blocking on a FIFO.
func openNoFollow(dir int, name string) (*os.File, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

func ownWalk(f *os.File, rel string, gid, depth int) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	mode := os.FileMode(viewFileMode)
	if fi.IsDir() {
		mode = viewDirMode
	} else if !fi.Mode().IsRegular() {
		return nil
	}
	if err := f.Chown(0, gid); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if !fi.IsDir() {
		return nil
	}
	if depth >= maxViewDepth {
		return fmt.Errorf("%s: nested deeper than %d directories: %w", rel, maxViewDepth, errdefs.ErrInvalidArgument)
	}
	ents, err := f.ReadDir(-1)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	for _, e := range ents {
		if e.Type()&os.ModeSymlink != 0 {
			continue
		}
		g, err := openNoFollow(int(f.Fd()), e.Name())
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOENT) {
			continue // a link after all, or gone
		}
		if err != nil {
			return fmt.Errorf("%s/%s: %w", rel, e.Name(), err)
		}
		err = ownWalk(g, rel+"/"+e.Name(), gid, depth+1)
		g.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// point makes uploads/temparea a link to conv's uploads, replacing the
// link in one rename.
func (v *podViews) point(conv string) error {
	up, err := v.openUploads()
	if err != nil {
		return err
	}
	defer up.Close()
	upfd := int(up.Fd())
	const tmp = ".temparea-next" // no conversation's name starts with a dot
	_ = unix.Unlinkat(upfd, tmp, 0)
	if err := unix.Symlinkat(conv+"/"+viewLink, upfd, tmp); err != nil {
		return fmt.Errorf("uploads/%s: %w", viewLink, err)
	}
	if err := unix.Renameat(upfd, tmp, upfd, viewLink); err != nil {
		_ = unix.Unlinkat(upfd, tmp, 0)
		return fmt.Errorf("uploads/%s is not the link sbx made: %w: %w", viewLink, err, errdefs.ErrUnavailable)
	}
	return nil
}

// withFileCapsDo runs fn on a thread of its own with fileCaps effective
// (see withFileCaps), and waits for it.
func withFileCapsDo(fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := raiseCaps(fileCaps)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		err = fn()
		if restore() == nil {
			runtime.UnlockOSThread()
		} // else the thread ends with this goroutine, still locked
		done <- err
	}()
	return <-done
}
