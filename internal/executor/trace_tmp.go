package executor

// TEMPORARY latency instrumentation; removed before the change is done.

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	traceOnce sync.Once
	traceF    *os.File
)

func monoNs() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// Trace writes "mono_ns go event" to $SBX_TRACE.
func Trace(ev string, args ...any) {
	traceOnce.Do(func() {
		if p := os.Getenv("SBX_TRACE"); p != "" {
			traceF, _ = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o666)
		}
	})
	if traceF == nil {
		return
	}
	if len(args) > 0 {
		ev = fmt.Sprintf(ev, args...)
	}
	fmt.Fprintf(traceF, "%d go %s\n", monoNs(), ev)
}
