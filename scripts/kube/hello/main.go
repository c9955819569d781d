// Command hello is the test image of scripts/kube-test.sh: a static HTTP
// server that answers "hello from POD" on :8080, so the test can check
// that the host reaches a Pod's IP directly, as the kubernetes runtime's
// control plane does when it dials an executor.
package main

import (
	"fmt"
	"log"
	"net/http"
	"os"
	"time"
)

func main() {
	name, _ := os.Hostname()
	srv := &http.Server{
		Addr:              ":8080",
		ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", name)
		}),
	}
	log.Fatal(srv.ListenAndServe())
}
