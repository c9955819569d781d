package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/workspace"
)

// Presigned downloads. A presigned URL names a copy of the
// file in the blob store: an object (snapshot.Store.PutObject) addressed
// by its SHA-256 in a namespace of the tenant's, so it keeps working
// whatever happens to the workspace (the file changes, the session is
// deleted) until it expires: the behaviour of an S3 presigned URL. The
// signature is an HMAC of the namespace, the hash, the name and the
// expiry under the server's signing key.

const (
	defaultPresignExpiry = 3600
	maxPresignExpiry     = 7 * 24 * 3600
)

// presignGrace is how long a copy is kept after the last URL made for it
// expires: a download that started just before is not cut short.
const presignGrace = time.Hour

var blobNamePattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// sign is the signature of a URL. The "v2" line keeps these signatures
// apart from those of the URLs made before copies had namespaces.
func (s *Server) sign(ns, sum, name string, expires int64) string {
	mac := hmac.New(sha256.New, s.opt.SigningKey)
	fmt.Fprintf(mac, "v2\n%s\n%s\n%s\n%d", ns, sum, name, expires)
	return hex.EncodeToString(mac.Sum(nil))
}

func (s *Server) presignNamespace(tenant string) string {
	return presignNamespace(s.opt.SigningKey, tenant)
}

// presignNamespace is the tenant's namespace of presigned copies as URLs
// show it: a MAC of its name, so that neither blob keys nor URLs show
// tenant names and a URL can name no other tenant's copy.
func presignNamespace(signingKey []byte, tenant string) string {
	mac := hmac.New(sha256.New, signingKey)
	fmt.Fprintf(mac, "presigned copies of tenant\n%s", tenant)
	return hex.EncodeToString(mac.Sum(nil))[:32]
}

// presignObjects is the object namespace of the URLs' namespace ns: one
// no tenant name can be (they start with a letter or digit), so that its
// chunks are never a tenant's own.
func presignObjects(ns string) string { return "_presigned-" + ns }

// PresignNamespace is the tenant's object namespace of presigned copies
// in the snapshot store, for what it stores (session.Options.StoredPrefixes).
func PresignNamespace(signingKey []byte, tenant string) string {
	return presignObjects(presignNamespace(signingKey, tenant))
}

// DefaultPresignMaxBytes is the largest file a presigned URL is made for
// unless Options.PresignMaxBytes says otherwise.
const DefaultPresignMaxBytes = 8 << 30

func (s *Server) presignMax() int64 {
	if s.opt.PresignMaxBytes > 0 {
		return s.opt.PresignMaxBytes
	}
	return DefaultPresignMaxBytes
}

// presign copies file into the tenant's presigned copies (unless the same
// content is there already, kept long enough) and answers with a signed
// URL for it.
func (s *Server) presign(w http.ResponseWriter, r *http.Request, file workspace.File, name string) {
	expiry, err := queryInt(r.URL.Query().Get("expires_in"), defaultPresignExpiry, 1, maxPresignExpiry, "expires_in")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ns := s.presignNamespace(tenant(r))
	// A copy is read and hashed whole: a sparse file of a TiB costs its
	// sandbox nothing and would cost the server minutes of a core, for
	// every presign of it.
	max := s.presignMax()
	tooLarge := func(size int64) error {
		return fmt.Errorf("presign: %q is %d bytes or more, more than the %d a presigned copy may have (the server's --presign-max-bytes); download it directly: %w",
			name, size, max, errdefs.ErrTooLarge)
	}
	if size := file.Info().Size; size > max {
		s.writeError(w, r, tooLarge(size))
		return
	}
	if err := s.opt.Sessions.Stored().Admit(r.Context(), tenant(r)); err != nil {
		s.writeError(w, r, err)
		return
	}
	expires := time.Now().Add(time.Duration(expiry) * time.Second).Truncate(time.Second)
	// The sandbox can change the file at any moment: the bytes are read
	// once, and what was hashed is what is stored.
	obj, err := s.opt.Objects.PutObject(r.Context(), presignObjects(ns), "", file, max, expires.Add(presignGrace))
	s.opt.Sessions.Stored().Add(tenant(r), obj.NewBytes)
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		err = tooLarge(max + 1) // it grew meanwhile
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	u := url.URL{
		Path:     api.Prefix + "/presigned/" + ns + "/" + obj.SHA256 + "/" + name, // String escapes it (once)
		RawQuery: url.Values{"expires": {strconv.FormatInt(expires.Unix(), 10)}, "signature": {s.sign(ns, obj.SHA256, name, expires.Unix())}}.Encode(),
	}
	if r.Host != "" {
		u.Scheme, u.Host = "http", r.Host
		if r.TLS != nil {
			u.Scheme = "https"
		}
	}
	writeJSON(w, http.StatusOK, api.PresignResponse{URL: u.String(), ExpiresAt: expires.UTC()})
}

// presigned: GET /presigned/{ns}/{blob}/{name}: no API key, the signature
// is the credential. Ranges are served from the chunks they span.
func (s *Server) presigned(w http.ResponseWriter, r *http.Request) {
	ns, sum, name := r.PathValue("ns"), r.PathValue("blob"), r.PathValue("name")
	q := r.URL.Query()
	expires, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	if err != nil || !blobNamePattern.MatchString(sum) || !nsPattern.MatchString(ns) {
		s.writeError(w, r, fmt.Errorf("not a presigned URL of this server: %w", errdefs.ErrPermissionDenied))
		return
	}
	want := s.sign(ns, sum, name, expires)
	if !hmac.Equal([]byte(want), []byte(q.Get("signature"))) {
		s.writeError(w, r, fmt.Errorf("the signature does not match: %w", errdefs.ErrPermissionDenied))
		return
	}
	if time.Now().Unix() > expires {
		s.writeError(w, r, fmt.Errorf("the URL expired at %s: %w", time.Unix(expires, 0).UTC().Format(time.RFC3339), errdefs.ErrPermissionDenied))
		return
	}
	o, err := s.opt.Objects.OpenObject(r.Context(), presignObjects(ns), sum)
	if errors.Is(err, errdefs.ErrNotFound) {
		s.presignedBefore(w, r, ns, sum, name)
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	defer o.Close()
	w.Header().Set("Content-Disposition", attachment(name))
	http.ServeContent(w, r, name, o.ModTime(), o)
}

// presignedBefore serves a copy that a server before objects made: a
// whole blob at presigned/NS/SHA256, signed as URLs are now. Its URLs live
// for up to a week after an upgrade; nothing writes such copies any more,
// and an operator removes presigned/ from the blob store a week after the
// upgrade (README, "Upgrading").
func (s *Server) presignedBefore(w http.ResponseWriter, r *http.Request, ns, sum, name string) {
	b, err := s.opt.Blobs.Open(r.Context(), "presigned/"+ns+"/"+sum)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			err = fmt.Errorf("the file is no longer kept: %w", errdefs.ErrNotFound)
		}
		s.writeError(w, r, err)
		return
	}
	defer b.Close()
	w.Header().Set("Content-Disposition", attachment(name))
	http.ServeContent(w, r, name, b.Info().ModTime, b)
}

var nsPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// healthz: GET /healthz: the process is up.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{Status: "ok"})
}

// readyz: GET /readyz: the store answers, and so does every check of
// Options.Ready (the blob store, the sandbox runtime).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	checks := map[string]string{"store": "ok"}
	if err := s.opt.Store.Ping(r.Context()); err != nil {
		checks["store"] = err.Error()
	}
	if s.opt.Ready != nil {
		for name, err := range s.opt.Ready() {
			checks[name] = "ok"
			if err != nil {
				checks[name] = err.Error()
			}
		}
	}
	for _, v := range checks {
		if v != "ok" {
			writeJSON(w, http.StatusServiceUnavailable, api.Health{Status: "unavailable", Checks: checks})
			return
		}
	}
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Checks: checks})
}
