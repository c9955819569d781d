// Command probe is the network test image of scripts/kube-test.sh: it
// serves TCP ports, and from inside a Pod it tries a connection, a name
// or the API server, so the test can check what the cluster's Services,
// DNS and NetworkPolicies let a Pod reach.
//
//	probe serve PORT...  accept on each port, answer "probe HOSTNAME PORT"
//	probe dial ADDR      exit 0 when a TCP connection to ADDR opens within 3 s
//	probe lookup NAME    print NAME's addresses (the Pod's resolv.conf)
//	probe write FILE     create FILE (a volume's write check)
//	probe api            GET /api through the kubernetes Service with the
//	                     Pod's service-account token; print the status code
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const sa = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	if len(os.Args) < 2 {
		fail("usage: probe serve PORT... | dial ADDR | lookup NAME | api")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	switch arg := os.Args[2:]; os.Args[1] {
	case "serve":
		serve(arg)
	case "dial":
		need(arg, 1)
		c, err := (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, "tcp", arg[0])
		if err != nil {
			fail("closed: " + err.Error())
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		b, _ := io.ReadAll(io.LimitReader(c, 200))
		_ = c.Close()
		fmt.Printf("open %s\n", strings.TrimSpace(string(b)))
	case "lookup":
		need(arg, 1)
		addrs, err := net.DefaultResolver.LookupHost(ctx, arg[0])
		if err != nil {
			fail(err.Error())
		}
		fmt.Println(strings.Join(addrs, " "))
	case "write":
		need(arg, 1)
		if err := os.WriteFile(arg[0], []byte("probe\n"), 0o600); err != nil {
			fail(err.Error())
		}
	case "api":
		api(ctx)
	default:
		fail("unknown command " + os.Args[1])
	}
}

func serve(ports []string) {
	if len(ports) == 0 {
		fail("serve: name the ports")
	}
	host, _ := os.Hostname()
	for _, p := range ports {
		l, err := net.Listen("tcp", ":"+p)
		if err != nil {
			fail(err.Error())
		}
		go func(l net.Listener, p string) {
			for {
				c, err := l.Accept()
				if err != nil {
					continue
				}
				fmt.Fprintf(c, "probe %s %s\n", host, p)
				_ = c.Close()
			}
		}(l, p)
	}
	select {}
}

func api(ctx context.Context) {
	token, err := os.ReadFile(sa + "/token")
	if err != nil {
		fail(err.Error())
	}
	ca, err := os.ReadFile(sa + "/ca.crt")
	if err != nil {
		fail(err.Error())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		fail("no certificate in ca.crt")
	}
	// The name in-cluster clients verify: the Service's DNS name, reached
	// at the Service's ClusterIP from the environment.
	addr := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes.default.svc", MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://kubernetes.default.svc/api", nil)
	if err != nil {
		fail(err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		fail(err.Error())
	}
	_ = resp.Body.Close()
	fmt.Println(resp.StatusCode)
	if resp.StatusCode != http.StatusOK {
		os.Exit(1)
	}
}

func need(arg []string, n int) {
	if len(arg) != n {
		fail(fmt.Sprintf("%s: want %d argument(s)", os.Args[1], n))
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "probe:", msg)
	os.Exit(1)
}
