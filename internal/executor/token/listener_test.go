package token

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// served is a Listener on loopback with an HTTP server behind it that
// answers "ok SANDBOX" to every request.
type served struct {
	l    *Listener
	addr string
	hs   *http.Server
	done chan struct{}
}

func serve(t *testing.T, v *Verifier, opts ListenerOptions) *served {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewListener(inner, v, opts)
	if err != nil {
		t.Fatal(err)
	}
	s := &served{l: l, addr: inner.Addr().String(), done: make(chan struct{})}
	s.hs = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok "+v.SandboxID())
	})}
	go func() { defer close(s.done); s.hs.Serve(l) }()
	t.Cleanup(func() {
		s.hs.Close()
		<-s.done
	})
	return s
}

// get makes one request over a connection the signer dials.
func get(t *testing.T, s *Signer, addr, id string) (string, error) {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return s.Dial(ctx, nil, "tcp", addr, id)
	}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://executor/health", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// refused writes payload on a raw connection and fails the test unless the
// listener closes it without a byte of answer. The caller then closes its
// writing side.
func refused(t *testing.T, addr string, payload []byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// A 1 MB payload does not fit the socket buffers: the listener
		// closes mid-write, and the write fails. That is the point.
		c.Write(payload)
		if bytes.HasSuffix(payload, []byte("\n")) {
			c.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
		}
		// A caller that is done writing: what it sent is all there is.
		c.(*net.TCPConn).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(time.Minute)) // a bound on a hang, not a timing assertion
	b, err := io.ReadAll(c)
	wg.Wait()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the listener kept a bad connection open for a minute")
	}
	if len(b) > 0 {
		t.Fatalf("a refused connection got an answer: %q", b)
	}
}

func TestListenerServesGoodCaller(t *testing.T) {
	s, v := newPair(t, "sb-1")
	s.now, v.now = time.Now, time.Now
	srv := serve(t, v, ListenerOptions{})
	for range 3 {
		body, err := get(t, s, srv.addr, "sb-1")
		if err != nil || body != "ok sb-1" {
			t.Fatalf("get = %q, %v", body, err)
		}
	}
	if n := srv.l.Refused(); n != 0 {
		t.Fatalf("%d refused", n)
	}
}

// TestListenerPreambleAndRequestTogether: the request's first bytes may
// arrive in the same segment as the preamble; the listener must hand them
// on, not drop them.
func TestListenerPreambleAndRequestTogether(t *testing.T) {
	s, v := newPair(t, "sb-1")
	s.now, v.now = time.Now, time.Now
	srv := serve(t, v, ListenerOptions{})
	line, err := s.Preamble("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(append(line, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"...)); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 200")) || !bytes.HasSuffix(b, []byte("ok sb-1")) {
		t.Fatalf("answer %q", b)
	}
}

// TestListenerRefuses is the attacks on the listener: each connection is
// closed with no answer, and the good caller still gets in afterwards.
func TestListenerRefuses(t *testing.T) {
	s, v := newPair(t, "sb-1")
	s.now, v.now = time.Now, time.Now
	other, _ := newPair(t, "sb-1")
	other.now = time.Now
	srv := serve(t, v, ListenerOptions{})
	pre := func(s *Signer, id string) []byte {
		b, err := s.Preamble(id)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	expired := []byte(preamblePrefix + s.sign(Claims{SandboxID: "sb-1", IssuedAt: time.Now().Add(-3 * time.Minute), ExpiresAt: time.Now().Add(-2 * time.Minute)}) + "\n")
	future := []byte(preamblePrefix + s.sign(Claims{SandboxID: "sb-1", IssuedAt: time.Now().Add(time.Hour), ExpiresAt: time.Now().Add(time.Hour + time.Minute)}) + "\n")
	good := pre(s, "sb-1")
	cases := []struct {
		name    string
		payload []byte
	}{
		{"wrong key", pre(other, "sb-1")},
		{"another sandbox's token", pre(s, "sb-2")},
		{"expired", expired},
		{"future-dated", future},
		{"truncated", append(good[:len(good)/2:len(good)/2], '\n')},
		{"garbage", []byte("\x00\x01\x02garbage\n")},
		{"plain HTTP", []byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n")},
		{"wrong prefix", append([]byte("SBX-EXECUTOR-AUTH v2 "), good[len(preamblePrefix):]...)},
		{"lower-case prefix", append([]byte(strings.ToLower(preamblePrefix)), good[len(preamblePrefix):]...)},
		{"token with trailing space", append(bytes.Clone(good[:len(good)-1]), " \n"...)},
		{"CRLF", append(bytes.Clone(good[:len(good)-1]), "\r\n"...)},
		{"1 MB line", bytes.Repeat([]byte("A"), 1<<20)},
		{"good token past 1 KiB", append(bytes.Repeat([]byte(" "), MaxPreamble), good...)},
		{"half a preamble then close", bytes.Clone(good[:len(good)-1])},
		{"nothing then close", nil},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			refused(t, srv.addr, tc.payload)
			// The listener counts before it closes.
			if n := srv.l.Refused(); n != uint64(i+1) {
				t.Fatalf("refused count %d, want %d", n, i+1)
			}
		})
	}
	if body, err := get(t, s, srv.addr, "sb-1"); err != nil || body != "ok sb-1" {
		t.Fatalf("good caller after the attacks: %q, %v", body, err)
	}
}

// TestListenerReplayOnAnotherExecutor: a token the control plane gave
// sandbox A's executor (which A's tenant could read off the wire if it
// ever got one) opens nothing on B, on the same network with the same key.
func TestListenerReplayOnAnotherExecutor(t *testing.T) {
	s, _ := newPair(t, "sb-a")
	s.now = time.Now
	va, err := NewVerifier(s.PublicKey(), "sb-a")
	if err != nil {
		t.Fatal(err)
	}
	vb, err := NewVerifier(s.PublicKey(), "sb-b")
	if err != nil {
		t.Fatal(err)
	}
	a, b := serve(t, va, ListenerOptions{}), serve(t, vb, ListenerOptions{})
	line, err := s.Preamble("sb-a")
	if err != nil {
		t.Fatal(err)
	}
	refused(t, b.addr, line)
	if b.l.Refused() != 1 {
		t.Fatalf("b refused %d", b.l.Refused())
	}
	// The same line is good on A: a token is checked when a connection
	// opens and is not single-use (SECURITY.md says what that leaves).
	c, err := net.Dial("tcp", a.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(append(line, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"...))
	if got, _ := io.ReadAll(c); !bytes.HasSuffix(got, []byte("ok sb-a")) {
		t.Fatalf("A answered %q", got)
	}
}

// waitFor polls cond; the bound is on a hang, not a timing assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (l *Listener) inHandshake() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending)
}

// TestListenerSlowLoris: callers that open a connection and dribble a
// preamble with no newline (or send nothing) do not stop a good caller,
// and Close closes them.
func TestListenerSlowLoris(t *testing.T) {
	s, v := newPair(t, "sb-1")
	s.now, v.now = time.Now, time.Now
	// A handshake timeout far beyond the test: only the bound on
	// concurrent handshakes and running them off Accept keep it working.
	srv := serve(t, v, ListenerOptions{HandshakeTimeout: time.Hour, MaxHandshakes: 16})
	var loris []net.Conn
	for i := range 10 {
		c, err := net.Dial("tcp", srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i%2 == 0 {
			c.Write([]byte(preamblePrefix + "AAAA"))
		}
		loris = append(loris, c)
	}
	waitFor(t, "10 connections in their handshake", func() bool { return srv.l.inHandshake() == 10 })
	if body, err := get(t, s, srv.addr, "sb-1"); err != nil || body != "ok sb-1" {
		t.Fatalf("good caller during a slow loris: %q, %v", body, err)
	}
	srv.hs.Close() // closes the Listener
	<-srv.done
	for _, c := range loris {
		c.SetReadDeadline(time.Now().Add(time.Minute))
		if b, err := io.ReadAll(c); len(b) > 0 || err != nil {
			t.Fatalf("a pending connection after Close: %q, %v", b, err)
		}
	}
	if n := srv.l.inHandshake(); n != 0 {
		t.Fatalf("%d connections still in their handshake after Close", n)
	}
}

// TestListenerHandshakeTimeout: a silent connection is closed when its
// handshake time is up.
func TestListenerHandshakeTimeout(t *testing.T) {
	_, v := newPair(t, "sb-1")
	srv := serve(t, v, ListenerOptions{HandshakeTimeout: 50 * time.Millisecond})
	refused(t, srv.addr, []byte(preamblePrefix)) // never finished: the listener closes it
	if srv.l.Refused() != 1 {
		t.Fatalf("refused %d", srv.l.Refused())
	}
}

// TestListenerManyHalfOpen: more half-open connections than handshake
// slots cost no more than the slots (the rest are closed at once), and
// the listener serves again as soon as a slot frees.
func TestListenerManyHalfOpen(t *testing.T) {
	s, v := newPair(t, "sb-1")
	s.now, v.now = time.Now, time.Now
	const slots = 4
	srv := serve(t, v, ListenerOptions{HandshakeTimeout: time.Hour, MaxHandshakes: slots})
	var held []net.Conn
	for range slots {
		c, err := net.Dial("tcp", srv.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	waitFor(t, "every slot taken", func() bool { return srv.l.inHandshake() == slots })
	const extra = 50
	for i := range extra {
		refused(t, srv.addr, nil)
		if srv.l.Refused() != uint64(i+1) {
			t.Fatalf("refused %d, want %d", srv.l.Refused(), i+1)
		}
		if n := srv.l.inHandshake(); n != slots {
			t.Fatalf("%d in their handshake, bound %d", n, slots)
		}
	}
	held[0].Close()
	waitFor(t, "a slot to free", func() bool { return srv.l.inHandshake() == slots-1 })
	if body, err := get(t, s, srv.addr, "sb-1"); err != nil || body != "ok sb-1" {
		t.Fatalf("good caller once a slot freed: %q, %v", body, err)
	}
}

func TestListenerNeedsVerifier(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	if _, err := NewListener(inner, nil, ListenerOptions{}); err == nil {
		t.Fatal("a listener without a verifier")
	}
}
