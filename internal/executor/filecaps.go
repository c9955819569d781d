package executor

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/http"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/wire"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// filesHandler serves the file routes on the sandbox's workspace, with
// the sandbox's own owners: its root, and the user code runs as.
func (s *Server) filesHandler() http.Handler {
	return withFileCaps(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := s.workspace()
		if err != nil {
			writeError(w, err)
			return
		}
		if s.views != nil {
			s.ownUploads(ws, w, r)
			return
		}
		FilesHandler(ws).ServeHTTP(w, r)
	}))
}

// ownUploads serves a file route in the unprivileged mode, where what
// lands under uploads/C gets C's group and modes (podviews.go): an
// upload's conversation directory before the file is written (so that no
// other conversation's code can reach it meanwhile) and what was written
// after; everything after an import of the whole workspace.
func (s *Server) ownUploads(ws *workspace.Local, w http.ResponseWriter, r *http.Request) {
	var after func() error
	switch {
	case r.Method == http.MethodPut && r.URL.Path == wire.FilesUpload:
		conv := r.URL.Query().Get("conversation_id")
		if err := s.views.own(conv); err != nil {
			writeError(w, fmt.Errorf("files: %w", err))
			return
		}
		after = func() error { return s.views.own(conv) }
	case r.Method == http.MethodPut && r.URL.Path == wire.FilesArchive:
		after = s.views.ownAll
	}
	if after == nil {
		FilesHandler(ws).ServeHTTP(w, r)
		return
	}
	// The answer waits for the modes: a client that reads it may run code
	// of another conversation next.
	rec := &heldResponse{header: http.Header{}}
	FilesHandler(ws).ServeHTTP(rec, r)
	if err := after(); err != nil && rec.status < 300 {
		writeError(w, fmt.Errorf("files: %w", err))
		return
	}
	rec.send(w)
}

// workspace opens the workspace the first time a file route needs it: a
// sandbox whose workspace cannot be opened still runs code, and says why
// on the file routes.
func (s *Server) workspace() (*workspace.Local, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, fmt.Errorf("files: %w", errShuttingDown)
	}
	if s.ws == nil {
		owners := workspace.Owners{
			Root: workspace.Owner{UID: 0, GID: 0},
			User: workspace.Owner{UID: s.cfg.UID, GID: s.cfg.GID},
		}
		open := workspace.Open
		if s.cfg.Unprivileged {
			// A Pod's workspace is an emptyDir, the kubelet's (root's,
			// mode 0777): make it a workspace as the control plane makes
			// one on a host (the user's, with its uploads directory).
			open = workspace.Init
		}
		ws, err := open(s.cfg.Workspace, owners)
		if err != nil {
			return nil, fmt.Errorf("files: %w: %w", err, errdefs.ErrUnavailable)
		}
		s.ws = ws
	}
	return s.ws, nil
}

// fileCaps are what a file operation needs of the sandbox's root beyond
// what the executor always acts with (cmd/sbx-executor): to write in the
// user's directories (DAC_OVERRIDE), to give a file it wrote to the user
// (CHOWN), and to set the mode and times of a file it gave away (FOWNER).
// They mean nothing outside the sandbox's user namespace, and only the
// workspace is writable there.
const fileCaps = 1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_FOWNER

// withFileCaps runs h on a thread of its own with fileCaps effective, and
// on no other thread: capabilities are a thread's in Linux (and gVisor),
// so the rest of the executor keeps acting without them while a file
// operation runs. The goroutine stays locked to its thread for the call;
// the threads the Go runtime starts meanwhile are cloned from its
// template thread, not from this one. Capabilities the executor was not
// given (a test as a user, say) are not raised, and the operations that
// need them fail on their own.
func withFileCaps(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runtime.LockOSThread()
		restore, err := raiseCaps(fileCaps)
		if err != nil {
			runtime.UnlockOSThread()
			writeError(w, fmt.Errorf("files: %w", err))
			return
		}
		defer func() {
			if restore() != nil {
				// The thread keeps what it had: it ends with this
				// goroutine, which net/http ends for a panic.
				panic(http.ErrAbortHandler)
			}
			runtime.UnlockOSThread()
		}()
		h.ServeHTTP(w, r)
	})
}

// raiseCaps makes caps effective on this thread as far as they are
// permitted, and returns how to put the thread's sets back.
func raiseCaps(caps uint32) (restore func() error, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var old [2]unix.CapUserData
	if err := unix.Capget(&hdr, &old[0]); err != nil {
		return nil, fmt.Errorf("capget: %w", err)
	}
	set := func(data [2]unix.CapUserData) error {
		h := hdr
		// This thread only (capset acts on the calling thread).
		if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
			return fmt.Errorf("capset: %w", e)
		}
		return nil
	}
	raised := old
	raised[0].Effective |= caps & old[0].Permitted
	if raised[0].Effective == old[0].Effective {
		return func() error { return nil }, nil
	}
	if err := set(raised); err != nil {
		return nil, err
	}
	return func() error { return set(old) }, nil
}

// initWorkspace makes the workspace ready before any code runs, with the
// file capabilities on this one thread (a Pod's emptyDir is not the
// sandbox user's until then), and gives the conversations' uploads their
// groups (podviews.go).
func (s *Server) initWorkspace() error {
	if err := withFileCapsDo(func() error { _, err := s.workspace(); return err }); err != nil {
		return err
	}
	return s.views.ownAll()
}

// snapshotWorkspace walks the workspace for a run's artifacts. Under runc
// the executor reads any directory with DAC_READ_SEARCH, which it always
// acts with; a Pod's executor has no such capability (Pod Security's
// baseline has none), and the workspace (0711, the user's) is closed to
// it: the walk runs with the file capabilities on its thread.
func (s *Server) snapshotWorkspace() workspaceSnapshot {
	snap := s.walkWorkspace()
	s.workspaceBytes.Store(snap.bytes)
	return snap
}

func (s *Server) walkWorkspace() workspaceSnapshot {
	if !s.cfg.Unprivileged {
		return snapshotWorkspace(s.cfg.Workspace)
	}
	var snap workspaceSnapshot
	if err := withFileCapsDo(func() error { snap = snapshotWorkspace(s.cfg.Workspace); return nil }); err != nil {
		// Without the capabilities nothing of the workspace is known.
		return workspaceSnapshot{files: map[string]fileKey{}, modes: map[string]fs.FileMode{}, blind: true}
	}
	return snap
}

// heldResponse keeps a file route's answer (a few hundred bytes of JSON)
// until ownUploads has set the modes.
type heldResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header { return h.header }

func (h *heldResponse) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

func (h *heldResponse) Write(b []byte) (int, error) {
	h.WriteHeader(http.StatusOK)
	return h.body.Write(b)
}

func (h *heldResponse) send(w http.ResponseWriter) {
	for k, v := range h.header {
		w.Header()[k] = v
	}
	if h.status == 0 {
		h.status = http.StatusOK
	}
	w.WriteHeader(h.status)
	_, _ = w.Write(h.body.Bytes())
}
