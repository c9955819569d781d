package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/snapshot"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Resource sync. A client keeps a session's resources (skills,
// commands) in step with its own copy in at most three requests: PUT the
// manifest; PUT /resources/{sha256} the content of each resource the
// answer lists as needed; PUT the manifest again. An unchanged manifest is
// one request that touches nothing. Content is kept once per tenant, as
// an object of the blob store (snapshot.Store.PutObject) that any replica
// can copy into a workspace, for resourceKeep after its last upload, so
// a second session with the same skills meanwhile uploads nothing at all.

const (
	// maxManifestBody bounds a manifest: MaxResources entries of long
	// names fit.
	maxManifestBody = 4 << 20
	// maxResourceBytes bounds one resource's content.
	maxResourceBytes = 256 << 20
	// resourceKeep is how long content is kept after it was last put: a
	// client sends its manifest again within seconds of the upload, and a
	// resource in place is a copy in the workspace, which needs the
	// content no more.
	resourceKeep = time.Hour
)

// resourcesPath is where the sandbox sees the resources.
const resourcesPath = sandboxWorkspace + "/" + workspace.ResourcesDir

// syncLocks serialize the resource syncs of one session, and nothing
// else: a sync can be slow (a blob store that answers slowly, a large
// resource), and one tenant's must hold up no other session's, as locks
// shared by several sessions would. A sync waiting for its session's turn
// gives up when its request ends.
type syncLocks struct {
	mu   sync.Mutex
	held map[string]*syncLock
}

// syncLock is one session's lock: a token in ch is the holder's; refs
// counts holders and waiters, and the entry goes with the last of them.
type syncLock struct {
	ch   chan struct{}
	refs int
}

// lock takes the session's lock, or gives up with ctx's error.
func (l *syncLocks) lock(ctx context.Context, tenant, sid string) (unlock func(), err error) {
	key := tenant + "\x00" + sid
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*syncLock{}
	}
	e := l.held[key]
	if e == nil {
		e = &syncLock{ch: make(chan struct{}, 1)}
		l.held[key] = e
	}
	e.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.held, key)
		}
		l.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// syncResources: PUT /sessions/{id}/resources.
func (s *Server) syncResources(w http.ResponseWriter, r *http.Request) {
	var m api.ResourceManifest
	if err := decodeJSON(r, &m, maxManifestBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	want := make([]workspace.Resource, len(m.Resources))
	for i, res := range m.Resources {
		want[i] = workspace.Resource(res)
	}
	want, err := workspace.CheckManifest(want)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, t, sid := r.Context(), tenant(r), r.PathValue("session_id")
	ws, err := s.opt.Files.Open(ctx, t, sid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	unlock, err := s.syncLocks.lock(ctx, t, sid)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	done, err := ws.SyncResources(ctx, want, func(ctx context.Context, sum string) (io.ReadCloser, int64, error) {
		o, err := s.opt.Objects.OpenObject(ctx, t, sum)
		if err != nil {
			return nil, 0, err
		}
		return o, o.Size(), nil
	})
	unlock()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.ResourceSync{
		Path: resourcesPath, Complete: len(done.Needed) == 0, Needed: make([]api.NamedResource, len(done.Needed)),
		Added: nonNil(done.Added), Changed: nonNil(done.Changed), Removed: nonNil(done.Removed), Unchanged: done.Unchanged,
	}
	for i, res := range done.Needed {
		out.Needed[i] = api.NamedResource(res)
	}
	writeJSON(w, http.StatusOK, out)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// listResources: GET /sessions/{id}/resources.
func (s *Server) listResources(w http.ResponseWriter, r *http.Request) {
	ws, err := s.opt.Files.Open(r.Context(), tenant(r), r.PathValue("session_id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer ws.Close()
	have, err := ws.Resources(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.ResourceList{Path: resourcesPath, Resources: make([]api.NamedResource, len(have))}
	for i, res := range have {
		out.Resources[i] = api.NamedResource(res)
	}
	writeJSON(w, http.StatusOK, out)
}

// putContent: PUT /resources/{sha256}, the content of a resource a sync
// asked for. The server checks the hash as it stores it; what it stores
// counts toward the tenant's stored bytes.
func (s *Server) putContent(w http.ResponseWriter, r *http.Request) {
	sum := r.PathValue("sha256")
	if !snapshot.ValidSum(sum) {
		s.writeError(w, r, fmt.Errorf("content hash %q: want 64 lower-case hex digits: %w", sum, errdefs.ErrInvalidArgument))
		return
	}
	if r.ContentLength > maxResourceBytes {
		s.writeError(w, r, withStatus(http.StatusRequestEntityTooLarge, "payload_too_large",
			fmt.Errorf("content of %d bytes: a resource is at most %d bytes", r.ContentLength, maxResourceBytes)))
		return
	}
	t := tenant(r)
	if err := s.opt.Sessions.Stored().Admit(r.Context(), t); err != nil {
		s.writeError(w, r, err)
		return
	}
	obj, err := s.opt.Objects.PutObject(r.Context(), t, sum, r.Body, maxResourceBytes, time.Now().Add(resourceKeep))
	s.opt.Sessions.Stored().Add(t, obj.NewBytes)
	if err != nil {
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			err = withStatus(http.StatusRequestEntityTooLarge, "payload_too_large", err)
		}
		s.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if obj.Created {
		status = http.StatusCreated
	}
	writeJSON(w, status, api.ContentUpload{SHA256: sum, Size: obj.Size})
}
