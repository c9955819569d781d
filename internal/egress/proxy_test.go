package egress

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream is a server that counts the requests it gets.
func upstream(t *testing.T, tlsServer bool) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	})
	var s *httptest.Server
	if tlsServer {
		s = httptest.NewTLSServer(h)
	} else {
		s = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s, &hits
}

func startProxy(t *testing.T, allow []string) (*url.URL, *[]string) {
	var denied []string
	p, err := NewProxy(allow, func(s string) { denied = append(denied, s) })
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.Serve(ln)
	t.Cleanup(func() { p.Close() })
	u, _ := url.Parse("http://" + ln.Addr().String())
	return u, &denied
}

func TestProxyServesOnlyItsMirror(t *testing.T) {
	mirror, mirrorHits := upstream(t, false)
	other, otherHits := upstream(t, false)
	secure, secureHits := upstream(t, true)
	proxyURL, denied := startProxy(t, []string{mirror.URL + "/debian", secure.URL})
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}

	get := func(method, u string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, u, nil)
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("GET", mirror.URL+"/debian/dists/bookworm/InRelease"); code != 200 || body != "hello from /debian/dists/bookworm/InRelease" {
		t.Errorf("the mirror: %d %q", code, body)
	}
	if code, _ := get("HEAD", mirror.URL+"/pool/x.deb"); code != 200 {
		t.Errorf("HEAD to the mirror: %d", code)
	}
	if code, body := get("GET", secure.URL+"/x"); code != 200 || body != "hello from /x" {
		t.Errorf("the https mirror through a tunnel: %d %q", code, body)
	}
	for _, tc := range []struct{ method, url string }{
		{"GET", other.URL + "/debian/x"},                            // another origin
		{"POST", mirror.URL + "/debian/x"},                          // not a download
		{"PUT", mirror.URL + "/debian/x"},                           // not a download
		{"GET", "https://" + other.Listener.Addr().String() + "/"},  // a tunnel elsewhere
		{"GET", "https://" + mirror.Listener.Addr().String() + "/"}, // a tunnel to an http origin
	} {
		code, body := get(tc.method, tc.url)
		if code == 200 {
			t.Errorf("%s %s: %d %q, want it refused", tc.method, tc.url, code, body)
		}
	}
	if n := otherHits.Load(); n != 0 {
		t.Errorf("the other origin got %d requests", n)
	}
	if n := mirrorHits.Load(); n != 2 {
		t.Errorf("the mirror got %d requests, want 2 (the refused ones never reach it)", n)
	}
	if n := secureHits.Load(); n != 1 {
		t.Errorf("the https mirror got %d requests, want 1", n)
	}
	if len(*denied) != 5 {
		t.Errorf("denied reported %d times, want 5: %q", len(*denied), *denied)
	}
}

// TestProxyRefusesOriginRequests: a request that is not a proxy request
// (a path, not a URL) reaches nothing, whatever its Host says.
func TestProxyRefusesOriginRequests(t *testing.T) {
	mirror, hits := upstream(t, false)
	proxyURL, _ := startProxy(t, []string{mirror.URL})
	conn, err := net.Dial("tcp", proxyURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /debian/x HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", mirror.Listener.Addr())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || hits.Load() != 0 {
		t.Errorf("status %d, mirror hits %d", resp.StatusCode, hits.Load())
	}
}

func TestNewProxyRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "ftp://mirror/debian", "/debian", "http://"} {
		if _, err := NewProxy([]string{u}, nil); err == nil || !strings.Contains(err.Error(), "egress") {
			t.Errorf("%q: %v", u, err)
		}
	}
}
