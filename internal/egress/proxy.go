package egress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Proxy is an HTTP forward proxy that serves only its allow list: plain
// GET and HEAD requests to the allowed http origins, and CONNECT tunnels to
// the allowed https origins. Everything else gets 403 and is reported to
// Denied. It dials from this process's network namespace.
type Proxy struct {
	allowed map[string]bool // "host:port" of the allowed http origins
	tunnels map[string]bool // "host:port" of the allowed https origins
	denied  func(string)
	srv     *http.Server
	tr      *http.Transport
	wg      sync.WaitGroup

	mu     sync.Mutex
	open   map[net.Conn]bool // the connections of open tunnels
	closed bool
}

// NewProxy returns a proxy for the origins of urls (scheme, host and port;
// their paths are not a limit, since the mirror's suites, pools and
// indexes are all under it). denied, if not nil, receives a line per
// request it refused.
func NewProxy(urls []string, denied func(string)) (*Proxy, error) {
	p := &Proxy{allowed: map[string]bool{}, tunnels: map[string]bool{}, denied: denied, open: map[net.Conn]bool{}}
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("egress: %q is not an http or https URL", raw)
		}
		if u.Scheme == "https" {
			p.tunnels[origin(u.Scheme, u.Host)] = true
		} else {
			p.allowed[origin(u.Scheme, u.Host)] = true
		}
	}
	p.tr = &http.Transport{
		// Never another proxy from the environment: the allow list is
		// about where the bytes come from.
		Proxy:                 nil,
		DialContext:           dialIdle,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		DisableCompression:    true,
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          nil,
	}
	return p, nil
}

// IdleTimeout is how long an upstream connection may pass no bytes either
// way before the proxy drops it: a stalled mirror fails the download (and
// apt tries again) instead of holding a build for ever.
const IdleTimeout = 60 * time.Second

// dialIdle dials upstream; the connection dies after IdleTimeout without
// traffic.
func dialIdle(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &idleConn{Conn: c}, nil
}

// idleConn pushes its deadline IdleTimeout ahead at every read and write.
type idleConn struct{ net.Conn }

func (c *idleConn) Read(b []byte) (int, error) {
	c.Conn.SetDeadline(time.Now().Add(IdleTimeout))
	return c.Conn.Read(b)
}

func (c *idleConn) Write(b []byte) (int, error) {
	c.Conn.SetDeadline(time.Now().Add(IdleTimeout))
	return c.Conn.Write(b)
}

// origin is host:port with the scheme's default port filled in, lower case.
func origin(scheme, host string) string {
	host = strings.ToLower(host)
	if _, _, err := net.SplitHostPort(host); err == nil {
		return host
	}
	if scheme == "https" {
		return net.JoinHostPort(strings.Trim(host, "[]"), "443")
	}
	return net.JoinHostPort(strings.Trim(host, "[]"), "80")
}

// Serve serves connections from ln until Close.
func (p *Proxy) Serve(ln net.Listener) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = p.srv.Serve(ln)
	}()
}

// Close stops the proxy, its open tunnels and requests, and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	err := p.srv.Close()
	p.tr.CloseIdleConnections()
	p.wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) refuse(w http.ResponseWriter, what string) {
	if p.denied != nil {
		p.denied(what)
	}
	http.Error(w, "sbx egress proxy: refused: "+what+" (only the package mirror is reachable)", http.StatusForbidden)
}

// ServeHTTP forwards one proxied request or opens one tunnel.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.tunnel(w, r)
		return
	}
	u := r.URL
	if !u.IsAbs() || u.Scheme != "http" {
		p.refuse(w, fmt.Sprintf("%s %s: not a proxy request for an http URL", r.Method, u))
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		p.refuse(w, fmt.Sprintf("%s %s: only GET and HEAD", r.Method, u.Redacted()))
		return
	}
	if !p.allowed[origin(u.Scheme, u.Host)] {
		p.refuse(w, fmt.Sprintf("%s %s", r.Method, u.Redacted()))
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), nil)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, h := range []string{"Accept", "Range", "If-Modified-Since", "If-Range", "If-None-Match", "Cache-Control", "User-Agent"} {
		if v := r.Header.Values(h); len(v) > 0 {
			out.Header[h] = slices.Clone(v)
		}
	}
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		http.Error(w, "sbx egress proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for _, h := range []string{"Content-Type", "Content-Length", "Content-Range", "Last-Modified", "ETag", "Accept-Ranges", "Cache-Control", "Expires", "Date", "Location"} {
		if v := resp.Header.Values(h); len(v) > 0 {
			w.Header()[h] = slices.Clone(v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// tunnel serves CONNECT to an allowed https origin.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request) {
	target := origin("https", r.Host)
	if !p.tunnels[target] {
		p.refuse(w, "CONNECT "+r.Host)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	up, err := dialIdle(ctx, "tcp", target)
	cancel()
	if err != nil {
		http.Error(w, "sbx egress proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "sbx egress proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	if !p.track(down, up) {
		return
	}
	defer p.untrack(down, up)
	if _, err := down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() {
		// What the client sent after the request line is already read.
		_, _ = io.Copy(up, io.MultiReader(io.LimitReader(buf, int64(buf.Reader.Buffered())), down))
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(down, up)
		done <- struct{}{}
	}()
	// One direction ended: end the other too, and wait for it.
	<-done
	down.Close()
	up.Close()
	<-done
}

// track records a tunnel's connections so that Close can end them; it
// closes them and reports false if the proxy is closed already.
func (p *Proxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			c.Close()
		}
		return false
	}
	for _, c := range conns {
		p.open[c] = true
	}
	return true
}

func (p *Proxy) untrack(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.open, c)
	}
}
