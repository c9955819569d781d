package session_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/internal/runtime/runtimetest"
)

func TestMain(m *testing.M) {
	// The in-process executor (exec_test.go) starts its zygote through
	// this binary.
	runtimetest.RunHelper()
	code := m.Run()
	if code == 0 {
		// os/signal's loop lives as long as the process once a signal is
		// watched (the executor's reaper watches SIGCHLD).
		if err := goleak.Find(goleak.IgnoreAnyFunction("os/signal.loop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
