package token

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

const (
	// handshakeTimeout bounds the time from accept to a whole preamble.
	handshakeTimeout = 5 * time.Second
	// defaultMaxHandshakes bounds the connections in their handshake at
	// once; more are closed as they arrive.
	defaultMaxHandshakes = 64
	// rejectLogEvery spaces the warnings about refused connections: a
	// flood of them must not become a flood of log lines.
	rejectLogEvery = 10 * time.Second
)

// ListenerOptions tune a Listener. Zero fields take the defaults.
type ListenerOptions struct {
	// HandshakeTimeout is how long a new connection has to send its whole
	// preamble. Default 5 s.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the connections being checked at once: each
	// costs a goroutine and a 1 KiB buffer while it lasts. A connection
	// arriving when all are taken is closed at once. Default 64.
	MaxHandshakes int
	// Logger receives warnings about refused connections. Default: none.
	Logger *slog.Logger
}

// Listener hands out only connections that opened with a valid preamble
// for its Verifier. Everything else is closed without a byte of answer.
//
// The checks run off the Accept path, one goroutine per connection and at
// most MaxHandshakes at once, each under HandshakeTimeout: a caller that
// connects and sends nothing (or one byte a second) holds one slot for a
// few seconds and never stops a good caller from getting in.
type Listener struct {
	inner net.Listener
	v     *Verifier
	opts  ListenerOptions
	log   *slog.Logger

	slots chan struct{}
	ready chan net.Conn // handshaken connections, to Accept
	done  chan struct{} // closed by Close
	fail  chan struct{} // closed when the inner listener failed
	err   error         // why, set before fail is closed
	wg    sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	pending map[net.Conn]struct{} // in their handshake; Close closes them

	refused      atomic.Uint64 // bad preamble, timeout or no slot
	lastWarn     atomic.Int64  // unix nanos of the last warning
	refusedSince atomic.Uint64 // refusals since that warning
}

var _ net.Listener = (*Listener)(nil)

// NewListener checks every connection inner accepts against v. It starts
// accepting at once; Close stops it.
func NewListener(inner net.Listener, v *Verifier, opts ListenerOptions) (*Listener, error) {
	if v == nil {
		return nil, fmt.Errorf("token: a network listener without a verifier: %w", errdefs.ErrInvalidArgument)
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = handshakeTimeout
	}
	if opts.MaxHandshakes <= 0 {
		opts.MaxHandshakes = defaultMaxHandshakes
	}
	l := &Listener{
		inner:   inner,
		v:       v,
		opts:    opts,
		log:     opts.Logger,
		slots:   make(chan struct{}, opts.MaxHandshakes),
		ready:   make(chan net.Conn),
		done:    make(chan struct{}),
		fail:    make(chan struct{}),
		pending: map[net.Conn]struct{}{},
	}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Accept returns the next connection that passed its handshake.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	case <-l.fail:
		return nil, l.err
	}
}

// Close stops accepting, closes the connections still in their handshake
// and waits for every goroutine of the Listener.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	for c := range l.pending {
		c.Close()
	}
	l.mu.Unlock()
	err := l.inner.Close()
	l.wg.Wait()
	return err
}

// Addr is the inner listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Refused is how many connections were closed unanswered so far.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.inner.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				l.err = err
				close(l.fail)
				return
			}
			// Out of file descriptors and the like: a flood of
			// connections must not end the executor. Wait and retry,
			// as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.log.Warn("executor listener: accept", "err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-l.done:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		select {
		case l.slots <- struct{}{}:
		default:
			l.refuse(c, errors.New("too many connections in their handshake"))
			c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		l.pending[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(c)
	}
}

func (l *Listener) handshake(c net.Conn) {
	defer l.wg.Done()
	conn, err := l.check(c)
	l.mu.Lock()
	delete(l.pending, c)
	l.mu.Unlock()
	<-l.slots
	if err != nil {
		l.refuse(c, err)
		c.Close()
		return
	}
	select {
	case l.ready <- conn:
	case <-l.done:
		c.Close()
	}
}

// check reads the preamble and verifies its token. Bytes read past the
// newline (the caller's first request may come in the same segment) are
// handed back by the returned connection.
func (l *Listener) check(c net.Conn) (net.Conn, error) {
	if err := c.SetDeadline(time.Now().Add(l.opts.HandshakeTimeout)); err != nil {
		return nil, err
	}
	buf := make([]byte, MaxPreamble)
	n := 0
	end := -1
	for end < 0 {
		if n == len(buf) {
			return nil, fmt.Errorf("no preamble in the first %d bytes", MaxPreamble)
		}
		m, err := c.Read(buf[n:])
		if i := bytes.IndexByte(buf[n:n+m], '\n'); i >= 0 {
			end = n + i
		}
		n += m
		if end < 0 && err != nil {
			return nil, fmt.Errorf("reading the preamble: %w", err)
		}
	}
	line, rest := buf[:end], buf[end+1:n]
	tok, ok := bytes.CutPrefix(line, []byte(preamblePrefix))
	if !ok {
		return nil, errors.New("not an executor preamble")
	}
	if _, err := l.v.Verify(string(tok)); err != nil {
		return nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if len(rest) == 0 {
		return c, nil
	}
	return &prefixConn{Conn: c, buf: bytes.Clone(rest)}, nil
}

// refuse counts a refused connection, before it is closed (so that a
// caller that saw the close sees the count), and warns now and then.
func (l *Listener) refuse(c net.Conn, why error) {
	l.refused.Add(1)
	l.refusedSince.Add(1)
	now := time.Now().UnixNano()
	last := l.lastWarn.Load()
	if now-last < int64(rejectLogEvery) || !l.lastWarn.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn("executor listener: refused a connection", "remote", c.RemoteAddr().String(), "err", why,
		"refused_since_last_warning", l.refusedSince.Swap(0))
}

// prefixConn is a connection whose first bytes were read with its preamble.
type prefixConn struct {
	net.Conn
	buf []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.buf) > 0 {
		n := copy(p, c.buf)
		c.buf = c.buf[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
