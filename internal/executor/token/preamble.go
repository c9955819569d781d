package token

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// preamblePrefix starts the first line of every connection to an executor
// that listens on a network. The version is the token's.
const preamblePrefix = "SBX-EXECUTOR-AUTH v1 "

// MaxPreamble bounds the first line the listener reads, newline included.
// A v1 preamble is at most len(preamblePrefix)+196+1 bytes.
const MaxPreamble = 1024

// Preamble is the line a connection to sandboxID's executor starts with.
func (s *Signer) Preamble(sandboxID string) ([]byte, error) {
	tok, err := s.Sign(sandboxID)
	if err != nil {
		return nil, err
	}
	return []byte(preamblePrefix + tok + "\n"), nil
}

// Dial connects to the executor of sandboxID at addr and writes the
// preamble, with a fresh token, before it returns the connection: the
// caller then speaks HTTP on it as on the unix socket. d may be nil.
func (s *Signer) Dial(ctx context.Context, d *net.Dialer, network, addr, sandboxID string) (net.Conn, error) {
	line, err := s.Preamble(sandboxID)
	if err != nil {
		return nil, err
	}
	if d == nil {
		d = &net.Dialer{}
	}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("executor %s at %s: %w: %w", sandboxID, addr, errdefs.ErrUnavailable, err)
	}
	// A fresh connection's send buffer takes the line at once; the
	// deadline only guards against a peer that is not what it should be.
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(handshakeTimeout)
	}
	_ = c.SetWriteDeadline(deadline)
	if _, err := c.Write(line); err != nil {
		c.Close()
		return nil, fmt.Errorf("executor %s at %s: preamble: %w: %w", sandboxID, addr, errdefs.ErrUnavailable, err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// Dialer returns a dial function for one sandbox's executor at addr, of
// the shape execclient.NewClient and runtime.Runtime.Dial want.
func (s *Signer) Dialer(d *net.Dialer, network, addr, sandboxID string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) { return s.Dial(ctx, d, network, addr, sandboxID) }
}
