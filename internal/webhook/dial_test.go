package webhook

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestBlocked(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "127.1.2.3": true, "::1": true, "0.0.0.0": true, "::": true,
		"10.1.2.3": true, "172.20.0.1": true, "192.168.1.1": true, "fd00:ec2::254": true,
		"169.254.169.254": true, "fe80::1": true, "100.100.100.200": true, "224.0.0.1": true,
		"255.255.255.255": true, "::ffff:127.0.0.1": true, "::ffff:10.0.0.1": true,
		"64:ff9b::7f00:1": true, "2002:a00:1::": true, "::7f00:1": true,
		"8.8.8.8": false, "1.1.1.1": false, "2606:4700:4700::1111": false,
		"64:ff9b::808:808": false, "2002:808:808::": false, "::ffff:8.8.8.8": false,
	} {
		if got := Blocked(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Blocked(%s) = %v, want %v", addr, got, want)
		}
	}
}

// The dialer refuses what a name resolves to, not only what a URL says.
func TestDialerRefusesLoopback(t *testing.T) {
	c := newClient(false, 5*time.Second)
	defer c.CloseIdleConnections()
	for _, u := range []string{"http://127.0.0.1:9/", "http://localhost:9/", "http://[::1]:9/"} {
		resp, err := c.Get(u)
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: dialled", u)
			continue
		}
		if !strings.Contains(err.Error(), "may not reach") {
			t.Errorf("%s: %v, want the dialer's refusal", u, err)
		}
	}
}

func TestJitter(t *testing.T) {
	for range 1000 {
		if d := jitter(time.Second); d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("jitter(1s) = %v", d)
		}
	}
}
