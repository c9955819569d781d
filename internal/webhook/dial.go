package webhook

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A tenant names the URL its events go to, and the server makes the
// request: from the server's side of every firewall. So a webhook may
// reach only public addresses unless the server is told otherwise
// (Options.AllowPrivate): not the server's own ports, its database, a
// cloud's metadata service or the private network. The check is of the
// address dialled, after the name is resolved, so a name that resolves
// (or re-resolves: DNS rebinding) to such an address is refused too, and
// redirects are not followed.

// blockedPrefixes are what no webhook reaches, beyond what netip's own
// predicates say (loopback, private, link-local, multicast, unspecified).
var blockedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),      // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT, and some clouds' metadata services
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and the broadcast address
	netip.MustParsePrefix("::/96"),          // IPv4-compatible (deprecated)
	netip.MustParsePrefix("100::/64"),       // discard
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("fec0::/10"),      // site-local (deprecated)
}

// nat64 and sixTo4 are IPv6 prefixes that carry an IPv4 address in their last
// (NAT64) or second to fifth (6to4) bytes, which must be allowed itself.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// Blocked says whether a webhook may not reach ip unless private
// destinations are allowed.
func Blocked(ip netip.Addr) bool {
	ip = ip.Unmap().WithZone("")
	if !ip.IsValid() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsInterfaceLocalMulticast() || ip.IsMulticast() || ip.IsUnspecified() {
		return true
	}
	for _, p := range blockedPrefixes {
		if p.Contains(ip) {
			return true
		}
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		return Blocked(netip.AddrFrom4([4]byte(b[12:16])))
	case sixTo4.Contains(ip):
		return Blocked(netip.AddrFrom4([4]byte(b[2:6])))
	}
	return false
}

// checkDial refuses a connection to a blocked address: net.Dialer's
// Control, which sees the address about to be dialled, resolved.
func checkDial(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("webhook: dialling %q, which is not an address", address)
	}
	if Blocked(ip) {
		return fmt.Errorf("webhook: %s is a loopback, private, link-local or reserved address, which webhooks may not reach (the server's --webhook-allow-private allows it)", ip)
	}
	return nil
}

// newClient is the HTTP client of deliveries: every attempt bounded by
// timeout, no proxy (a proxy would dial what it is asked to, unchecked),
// no redirects, and, unless allowPrivate, no blocked address.
func newClient(allowPrivate bool, timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = checkDial
	}
	tr := &http.Transport{
		DialContext:            d.DialContext,
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxIdleConnsPerHost:    2,
		IdleConnTimeout:        30 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
		ForceAttemptHTTP2:      true,
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// maxURL bounds a webhook's URL.
const maxURL = 2048

// checkURL says whether a webhook may be registered at raw: http or
// https, a host, no user info (it would be shown back in every listing),
// and, unless allowPrivate, not an address or name that is blocked on
// its face (names are checked again when dialled, resolved).
func checkURL(raw string, allowPrivate bool) error {
	bad := func(why string) error {
		return fmt.Errorf("webhook url %q: %s: %w", raw, why, errdefs.ErrInvalidArgument)
	}
	if len(raw) > maxURL {
		return fmt.Errorf("webhook url: longer than %d bytes: %w", maxURL, errdefs.ErrInvalidArgument)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return bad("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("want an http or https URL")
	case u.Host == "" || u.Hostname() == "":
		return bad("no host")
	case u.User != nil:
		return bad("user info is not allowed (put a token in the path or query, or verify the signature)")
	case u.Fragment != "":
		return bad("a fragment is not sent; leave it out")
	}
	if allowPrivate {
		return nil
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return bad("a loopback name, which webhooks may not reach (the server's --webhook-allow-private allows it)")
	}
	if ip, err := netip.ParseAddr(host); err == nil && Blocked(ip) {
		return bad("a loopback, private, link-local or reserved address, which webhooks may not reach (the server's --webhook-allow-private allows it)")
	}
	return nil
}
