package token

import (
	"context"
	"net"
	"testing"
	"time"
)

// BenchmarkSignVerify is the credential's share of a new connection: the
// control plane signs, the executor verifies.
func BenchmarkSignVerify(b *testing.B) {
	s, v := newPair(b, "sb-1")
	for b.Loop() {
		tok, err := s.Sign("sb-1")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnect is a whole new connection on loopback: dial, preamble,
// check, Accept; BenchmarkConnectPlain the same without the preamble.
func BenchmarkConnect(b *testing.B) {
	s, v := newPair(b, "sb-1")
	s.now, v.now = time.Now, time.Now
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	l, err := NewListener(inner, v, ListenerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	benchConnect(b, l, func(ctx context.Context) (net.Conn, error) {
		return s.Dial(ctx, nil, "tcp", inner.Addr().String(), "sb-1")
	})
}

func BenchmarkConnectPlain(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var d net.Dialer
	benchConnect(b, l, func(ctx context.Context) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", l.Addr().String())
	})
}

func benchConnect(b *testing.B, l net.Listener, dial func(context.Context) (net.Conn, error)) {
	ctx := context.Background()
	for b.Loop() {
		c, err := dial(ctx)
		if err != nil {
			b.Fatal(err)
		}
		sc, err := l.Accept()
		if err != nil {
			b.Fatal(err)
		}
		sc.Close()
		c.Close()
	}
}
