package app

import (
	"context"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/internal/testenv/pgtest"
)

// TestStoreWait: a server whose PostgreSQL does not answer yet (a Pod
// starting beside its database, a network policy not yet programmed)
// waits for it when told to, and fails at once when not.
func TestStoreWait(t *testing.T) {
	real := pgtest.URL(t)
	u, err := url.Parse(real)
	if err != nil {
		t.Fatal(err)
	}
	upstream := u.Host
	// A door that drops the first connections, then forwards.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var n atomic.Int32
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if n.Add(1) <= 2 {
				c.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := net.Dial("tcp", upstream)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(up, c)
				io.Copy(c, up)
			}()
		}
	}()
	u.Host = l.Addr().String()
	ctx := context.Background()
	if _, err := openStore(ctx, u.String(), t.TempDir(), 0); err == nil {
		t.Fatal("no wait, a store that drops the connection: opened")
	}
	st, err := openStore(ctx, u.String(), t.TempDir(), time.Minute)
	if err != nil {
		t.Fatalf("waiting: %v", err)
	}
	st.Close()
	if n.Load() < 3 {
		t.Errorf("%d connections, want a retry past the two dropped", n.Load())
	}
}
