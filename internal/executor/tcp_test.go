package executor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/executor/client"
	"github.com/sbx-sandbox/sbx/internal/executor/token"
)

// TestServeTCPWithAuth is a pod's executor: on a TCP address, reached
// only through a dialer that writes the control plane's token, and
// closing every other connection unanswered.
func TestServeTCPWithAuth(t *testing.T) {
	cfg := testConfig(t)
	pub, priv, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.NewSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Auth, err = token.NewVerifier(pub, "sb-tcp")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := cfg.Listener.Addr().String()
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Serve: %v", err)
		}
		os.RemoveAll(cfg.Workspace)
		os.RemoveAll(filepath.Dir(cfg.SocketPath))
	}()

	c := client.NewClient(signer.Dialer(nil, "tcp", addr, "sb-tcp"))
	defer c.Close()
	wctx, wcancel := context.WithTimeout(context.Background(), time.Minute)
	defer wcancel()
	if err := c.WaitReady(wctx); err != nil {
		t.Fatalf("WaitReady: %v\n%s", err, logs.String())
	}
	res, err := c.Run(wctx, py("import os; print('hello', os.getuid())"), nil)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Stdout != "hello 1000\n" {
		t.Fatalf("stdout %q, result %+v", res.Stdout, res)
	}
	if _, err := os.Stat(cfg.SocketPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a unix socket beside the TCP listener: %v", err)
	}

	// Another sandbox's token and no token at all get nothing.
	for name, dial := range map[string]func(context.Context) (net.Conn, error){
		"another sandbox's token": signer.Dialer(nil, "tcp", addr, "sb-other"),
		"no token": func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
	} {
		bad := client.NewClient(dial)
		if h, err := bad.Health(wctx); err == nil {
			t.Errorf("%s: health %+v", name, h)
		}
		bad.Close()
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	raw.Write([]byte("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
	raw.(*net.TCPConn).CloseWrite()
	raw.SetReadDeadline(time.Now().Add(time.Minute))
	if b, _ := io.ReadAll(raw); len(b) > 0 {
		t.Errorf("an anonymous caller got %q", b)
	}
	raw.Close()
	if !strings.Contains(logs.String(), "refused a connection") {
		t.Errorf("no warning about the refused connections in the log:\n%s", logs.String())
	}
}

// TestNewRefusesAnonymousListener: a network listener without a token
// verifier is a configuration error, never an open API.
func TestNewRefusesAnonymousListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = New(Config{Listener: l, AllowNoSeccomp: true, ControlDir: t.TempDir()})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("New = %v, want ErrInvalidArgument", err)
	}
}
