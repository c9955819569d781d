package server

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// Presigned downloads. A presigned URL names a copy of the
// file in the blob store, addressed by its SHA-256 in a namespace of the
// tenant's, so it keeps working
// whatever happens to the workspace (the file changes, the session is
// deleted) until it expires: the behaviour of an S3 presigned URL, which
// is what the S3 backend will hand out. The signature is an HMAC of the
// blob, the name and the expiry under the server's signing key.

const (
	defaultPresignExpiry = 3600
	maxPresignExpiry     = 7 * 24 * 3600
)

// Copies of presigned files are kept presignKeep after they were last
// written, and written again by a presign presignRefresh after that, so a
// copy outlives every URL made for it (maxPresignExpiry) and no longer.
const (
	presignRefresh = 24 * time.Hour
	presignKeep    = maxPresignExpiry*time.Second + presignRefresh + time.Hour
)

// CollectPresigned removes the copies no unexpired URL can name.
func CollectPresigned(ctx context.Context, blobs blob.Store, now time.Time) (n int, err error) {
	err = blobs.List(ctx, "presigned/", func(info blob.Info) error {
		if now.Sub(info.ModTime) <= presignKeep {
			return nil
		}
		if err := blobs.Delete(ctx, info.Key); err != nil {
			return err
		}
		n++
		return nil
	})
	return n, err
}

var blobNamePattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// sign is the signature of a URL. Copies live in a namespace per tenant
// (ns); the "v2" line keeps these signatures apart from those of the
// URLs made before namespaces (sum, name, expiry), which start with a
// hash.
func (s *Server) sign(ns, sum, name string, expires int64) string {
	mac := hmac.New(sha256.New, s.opt.SigningKey)
	if ns == "" {
		fmt.Fprintf(mac, "%s\n%s\n%d", sum, name, expires)
	} else {
		fmt.Fprintf(mac, "v2\n%s\n%s\n%s\n%d", ns, sum, name, expires)
	}
	return hex.EncodeToString(mac.Sum(nil))
}

func (s *Server) presignNamespace(tenant string) string {
	return presignNamespace(s.opt.SigningKey, tenant)
}

// presignNamespace is the tenant's namespace of presigned copies: a MAC
// of its name, so that neither blob keys nor URLs show tenant names and a
// URL can name no other tenant's copy.
func presignNamespace(signingKey []byte, tenant string) string {
	mac := hmac.New(sha256.New, signingKey)
	fmt.Fprintf(mac, "presigned copies of tenant\n%s", tenant)
	return hex.EncodeToString(mac.Sum(nil))[:32]
}

// PresignPrefix is where the tenant's presigned copies are in the blob
// store, for what it stores (session.Options.StoredPrefixes).
func PresignPrefix(signingKey []byte, tenant string) string {
	return "presigned/" + presignNamespace(signingKey, tenant) + "/"
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
// content is there already) and answers with a signed URL for it.
func (s *Server) presign(w http.ResponseWriter, r *http.Request, file *os.File, name string) {
	expiry, err := queryInt(r.URL.Query().Get("expires_in"), defaultPresignExpiry, 1, maxPresignExpiry, "expires_in")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ns := s.presignNamespace(tenant(r))
	// A copy is read, hashed and stored whole: a sparse file of a TiB
	// costs its sandbox nothing and would cost the server minutes of a
	// core, for every presign of it.
	if fi, err := file.Stat(); err != nil {
		s.writeError(w, r, err)
		return
	} else if max := s.presignMax(); fi.Size() > max {
		s.writeError(w, r, fmt.Errorf("presign: %q is %d bytes, more than the %d a presigned copy may have (the server's --presign-max-bytes); download it directly: %w",
			name, fi.Size(), max, errdefs.ErrTooLarge))
		return
	}
	if err := s.opt.Sessions.AdmitStored(r.Context(), tenant(r)); err != nil {
		s.writeError(w, r, err)
		return
	}
	sum, stored, err := copyPresigned(r.Context(), s.opt.Blobs, PresignPrefix(s.opt.SigningKey, tenant(r)), file)
	s.opt.Sessions.AddStored(tenant(r), stored)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	expires := time.Now().Add(time.Duration(expiry) * time.Second).Truncate(time.Second)
	u := url.URL{
		Path:     api.Prefix + "/presigned/" + ns + "/" + sum + "/" + name, // String escapes it (once)
		RawQuery: url.Values{"expires": {strconv.FormatInt(expires.Unix(), 10)}, "signature": {s.sign(ns, sum, name, expires.Unix())}}.Encode(),
	}
	if r.Host != "" {
		u.Scheme, u.Host = "http", r.Host
		if r.TLS != nil {
			u.Scheme = "https"
		}
	}
	writeJSON(w, http.StatusOK, api.PresignResponse{URL: u.String(), ExpiresAt: expires.UTC()})
}

// copyPresigned stores what it reads from r under dir/SHA256 and returns
// the hash and how many bytes it added to the blob store. The sandbox can change the file at any moment, so the bytes
// are read once: copied to a temporary blob while they are hashed, and
// that blob is what is kept under the hash. (Hashing one read and storing
// a second let a sandbox store content under another content's hash,
// which every URL for that hash then served.)
func copyPresigned(ctx context.Context, blobs blob.Store, dir string, r io.Reader) (string, int64, error) {
	tmp := dir + "tmp-" + randomHex(8)
	h := sha256.New()
	size, err := blobs.Put(ctx, tmp, io.TeeReader(r, h))
	if err != nil {
		blobs.Delete(context.WithoutCancel(ctx), tmp)
		return "", 0, err
	}
	defer blobs.Delete(context.WithoutCancel(ctx), tmp) // absent once moved
	sum := hex.EncodeToString(h.Sum(nil))
	key := dir + sum
	// A URL made now may be used until now+expiry; the collector keeps a
	// copy for presignKeep after its last write, so a copy older than
	// presignRefresh is written again.
	info, err := blobs.Stat(ctx, key)
	if err == nil && time.Since(info.ModTime) <= presignRefresh {
		return sum, 0, nil
	}
	if err == nil {
		size = 0 // written again: no more than before
	}
	if mv, ok := blobs.(blob.Mover); ok {
		return sum, size, mv.Move(ctx, tmp, key)
	}
	b, err := blobs.Open(ctx, tmp)
	if err != nil {
		return "", 0, err
	}
	defer b.Close()
	_, err = blobs.Put(ctx, key, b)
	return sum, size, err
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// presigned: GET /presigned/{ns}/{blob}/{name}: no API key, the signature
// is the credential. GET /presigned/{blob}/{name} serves the URLs made
// before copies had namespaces, until they expire (a week at most).
func (s *Server) presigned(w http.ResponseWriter, r *http.Request) {
	ns, sum, name := r.PathValue("ns"), r.PathValue("blob"), r.PathValue("name")
	q := r.URL.Query()
	expires, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	if err != nil || !blobNamePattern.MatchString(sum) || (ns != "" && !nsPattern.MatchString(ns)) {
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
	key := "presigned/" + sum
	if ns != "" {
		key = "presigned/" + ns + "/" + sum
	}
	b, err := s.opt.Blobs.Open(r.Context(), key)
	if err != nil {
		s.writeError(w, r, fmt.Errorf("the file is no longer kept: %w", errdefs.ErrNotFound))
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
