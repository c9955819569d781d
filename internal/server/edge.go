package server

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// The edge treats every caller as an attacker (issue 13): it bounds how
// long a client may hold a connection without sending, refuses what a
// browser on another site could send, and keeps downloaded files from
// running as pages of the API's origin.

// EdgeLimits bound what a client can hold of the server by sending
// slowly. There is deliberately no overall read or write timeout: uploads
// of any size, `?wait=true` long polls and event streams last as long as
// they need, as long as the client keeps sending. Zero fields take the
// defaults.
type EdgeLimits struct {
	// ReadHeaderTimeout is how long a client has to send a request's
	// headers. Default 10s.
	ReadHeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that has been waiting
	// this long for its next request. Default 2m.
	IdleTimeout time.Duration
	// BodyTimeout is the longest a request body may stall (no byte
	// arriving while the server waits for one), and the head start a
	// body has before MinBodyRate applies. Default 30s.
	BodyTimeout time.Duration
	// MinBodyRate is the slowest a body may arrive on average, in bytes
	// per second of the time the server spent waiting for it (time the
	// server spends on what it read does not count). Default 4096;
	// negative: no minimum rate, only BodyTimeout.
	MinBodyRate int64
}

// Default edge limits.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultHTTPIdleTimeout   = 2 * time.Minute
	DefaultBodyTimeout       = 30 * time.Second
	DefaultMinBodyRate       = 4 << 10
)

func (l EdgeLimits) withDefaults() EdgeLimits {
	if l.ReadHeaderTimeout <= 0 {
		l.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultHTTPIdleTimeout
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
	if l.MinBodyRate == 0 {
		l.MinBodyRate = DefaultMinBodyRate
	}
	return l
}

// HTTPServer is an http.Server for the handler with the edge's time
// limits; the caller sets what else it needs (ErrorLog) and serves.
func (s *Server) HTTPServer() *http.Server {
	hs := s.opt.Edge.server(s.Handler())
	hs.RegisterOnShutdown(s.Shutdown)
	return hs
}

// Shutdown ends the streams that would otherwise go on until their
// clients leave (GET /events), so that a graceful shutdown does not wait
// for them.
func (s *Server) Shutdown() { s.shutdownOnce.Do(func() { close(s.shutdown) }) }

// server has no ReadTimeout or WriteTimeout: they would bound a whole
// upload, long poll or event stream, however lively.
func (l EdgeLimits) server(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    64 << 10, // the API's headers are short; net/http allows 1 MiB
	}
}

// securityPolicy goes on every response: the API serves data, never a
// page, so nothing it sends may run script, load anything or be framed,
// even a planted .html or .svg opened in a browser.
const securityPolicy = "sandbox; default-src 'none'; frame-ancestors 'none'"

// guard is the outermost check of every request (the E2B APIs included):
// the response headers that keep browsers from running what is served,
// the no-key mode's defences against other web sites (DNS rebinding,
// cross-origin requests), and the pace a body must keep.
func (s *Server) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Security-Policy", securityPolicy)
		if len(s.opt.Keys) == 0 {
			// Without keys anything that reaches the port may act, and a
			// browser reaches it for any web page it shows: a page of a
			// name that resolves to 127.0.0.1 (DNS rebinding) names that
			// host, and a page's cross-origin request carries its origin.
			if !loopbackHost(r.Host) {
				s.writeError(w, r, withStatus(http.StatusMisdirectedRequest, "misdirected_request",
					fmt.Errorf("host %q is not a loopback name: without API keys the server answers only to localhost, *.localhost and loopback addresses (DNS rebinding protection); configure --api-key to serve other names", r.Host)))
				return
			}
			if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r) {
				s.writeError(w, r, fmt.Errorf("origin %q is not this server's: without API keys the server refuses requests from web pages of other origins (cross-site request protection): %w", o, errdefs.ErrPermissionDenied))
				return
			}
		}
		if r.Body != nil && r.Body != http.NoBody {
			if b := s.pace(w, r); b != nil {
				defer b.finish()
				r = r.WithContext(r.Context())
				r.Body = b
			}
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names this machine's
// loopback: localhost, NAME.localhost (RFC 6761 keeps it there), or a
// loopback address, with any port.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sameOrigin reports whether an Origin header is the origin the request
// was sent to: the same scheme and host:port (default ports spelt or
// not). "null" (a sandboxed frame, a file) is no one's origin.
func sameOrigin(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return strings.EqualFold(u.Scheme, scheme) && strings.EqualFold(withPort(u.Host, scheme), withPort(r.Host, scheme))
}

func withPort(hostport, scheme string) string {
	if _, _, err := net.SplitHostPort(hostport); err == nil {
		return hostport
	}
	if scheme == "https" {
		return net.JoinHostPort(strings.Trim(hostport, "[]"), "443")
	}
	return net.JoinHostPort(strings.Trim(hostport, "[]"), "80")
}

// pacedBody is a request body that must keep arriving: before each read
// it sets the connection's read deadline to what the client has earned,
// BodyTimeout from now at most, and less if it has been slower than
// MinBodyRate since the start. A client that stalls or trickles gets a
// timeout error (408), and net/http closes the connection.
type pacedBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	lim    EdgeLimits
	read   int64
	waited time.Duration // time spent in Read, waiting for the client
	state  int
}

const (
	bodyReading = iota
	bodyDone    // EOF: the deadline is cleared for what follows
	bodyFailed  // a read failed: the connection goes
)

// pace wraps the request's body, or returns nil where the connection's
// read deadline cannot be set (a handler test's recorder).
func (s *Server) pace(w http.ResponseWriter, r *http.Request) *pacedBody {
	rc := http.NewResponseController(w)
	// A deadline from the start bounds what net/http itself reads of a
	// body the handler leaves unread (it discards up to 256 KiB before it
	// answers); the first Read sets its own.
	if err := rc.SetReadDeadline(time.Now().Add(s.opt.Edge.BodyTimeout)); err != nil {
		return nil
	}
	return &pacedBody{ReadCloser: r.Body, rc: rc, lim: s.opt.Edge}
}

func (b *pacedBody) Read(p []byte) (int, error) {
	if b.state != bodyReading {
		return b.ReadCloser.Read(p)
	}
	budget := b.lim.BodyTimeout
	if b.lim.MinBodyRate > 0 {
		earned := b.lim.BodyTimeout + time.Duration(float64(b.read)/float64(b.lim.MinBodyRate)*float64(time.Second)) - b.waited
		budget = min(budget, earned)
	}
	if budget <= 0 {
		b.state = bodyFailed
		b.rc.SetReadDeadline(time.Now().Add(-time.Second))
		return 0, b.tooSlow()
	}
	start := time.Now()
	b.rc.SetReadDeadline(start.Add(budget))
	n, err := b.ReadCloser.Read(p)
	b.waited += time.Since(start)
	b.read += int64(n)
	switch {
	case err == io.EOF:
		// What follows (an event stream, a long poll) has no deadline;
		// net/http's own read, watching for the client to leave, starts
		// now and must not inherit this one.
		b.state = bodyDone
		b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.state = bodyFailed
		return n, b.tooSlow()
	case err != nil:
		b.state = bodyFailed
	}
	return n, err
}

func (b *pacedBody) tooSlow() error {
	rate := ""
	if b.lim.MinBodyRate > 0 {
		rate = fmt.Sprintf(" or averaged less than %d bytes/s", b.lim.MinBodyRate)
	}
	return withStatus(http.StatusRequestTimeout, "request_timeout",
		fmt.Errorf("request body: the client stalled for %s%s (after %d bytes)", b.lim.BodyTimeout, rate, b.read))
}

// finish runs when the handler returns: a body left unread gets
// BodyTimeout for net/http to discard what is left of it.
func (b *pacedBody) finish() {
	if b.state == bodyReading {
		b.rc.SetReadDeadline(time.Now().Add(b.lim.BodyTimeout))
	}
}

// checkJSONType refuses a JSON body not labelled application/json (with
// parameters or not). Browsers send text/plain, form and multipart
// bodies to any site without asking it first (no CORS preflight); a JSON
// content type they send only after a preflight this server never
// grants. An absent type is fine only for an empty body.
func checkJSONType(r *http.Request) (empty bool, err error) {
	ct := r.Header.Get("Content-Type")
	if ct == "" && r.ContentLength == 0 {
		return true, nil
	}
	mt, _, perr := mime.ParseMediaType(ct)
	if perr == nil && mt == "application/json" {
		return false, nil
	}
	if ct == "" {
		ct = "none"
	}
	return false, withStatus(http.StatusUnsupportedMediaType, "unsupported_media_type",
		fmt.Errorf("request body: Content-Type %q: the body must be JSON sent as Content-Type: application/json", ct))
}

// attachment is a Content-Disposition that makes a browser save a
// download under its name instead of showing it: filename= an ASCII
// stand-in, filename*= the name itself in UTF-8 (RFC 6266, RFC 8187).
// Every byte outside a small safe set is replaced or escaped, so no name
// can end the header or add a parameter.
func attachment(name string) string {
	var ascii, ext strings.Builder
	for _, r := range name {
		if r >= 0x20 && r < 0x7f && r != '"' && r != '\\' && r != '%' && r != ';' {
			ascii.WriteRune(r)
		} else {
			ascii.WriteByte('_')
		}
	}
	for _, c := range []byte(name) {
		if c < 0x80 && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$&+-.^_`|~", c) >= 0) {
			ext.WriteByte(c)
		} else {
			fmt.Fprintf(&ext, "%%%02X", c)
		}
	}
	return `attachment; filename="` + ascii.String() + `"; filename*=UTF-8''` + ext.String()
}
