// Command pause is the Pod sandbox ("infra") container of the test cluster
// made by scripts/kube.sh: containerd needs a pause image locally, and no
// image may come from a public registry, so the script builds this one.
//
// It holds the Pod's namespaces open by living: it waits for SIGINT or
// SIGTERM and exits 0. Being pid 1 of the Pod when the PID namespace is
// shared, it also reaps the orphans that re-parent to it, so they do not
// stay zombies.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		// Reap every child that has exited; WNOHANG so a living child
		// does not block the signal loop.
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
