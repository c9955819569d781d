package executor

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// A run goes straight from the executor to a worker the zygote forked and
// set up ahead of demand: the zygote hands each such worker's channel over
// ("worker" message) and is off the run's path. Only when none is left
// does the run wait for a fork ("spawn").

// idleWorker is a pre-forked run worker and the executor's end of its
// channel. Its child is in zygote.children from the start, so that its exit
// is noticed and a dying zygote takes it along.
type idleWorker struct {
	c  *child
	ch int
}

// runMsg is what a worker waits for on its channel, with the payload,
// stdout, stderr and result descriptors, for a run without a conversation.
var runMsg = []byte(`{"op":"run"}`)

// runFor is whom a worker runs for: a conversation (or none) and, in the
// unprivileged mode, that conversation's group (podviews.go).
type runFor struct {
	conversation string
	group        int
}

// fields adds f to a message to the zygote or a worker.
func (f runFor) fields(m map[string]any) map[string]any {
	if f.conversation != "" {
		m["conversation"] = f.conversation
	}
	if f.group != 0 {
		m["group"] = f.group
	}
	return m
}

// runMessage is the run message for a run for f. The worker is still
// privileged when it reads it: the conversation id (valid by then, see
// ValidConversationID) and its group are all of the request it sees before
// it drops its privileges, and it needs them to make the run's view of
// the uploads (worker.py's enter_run).
func runMessage(f runFor) []byte {
	if f.conversation == "" {
		return runMsg
	}
	b, _ := json.Marshal(f.fields(map[string]any{"op": "run"}))
	return b
}

// busyPreforkAfter is how long a run on a pre-forked worker goes before the
// zygote hears of it ("took"), so that it may fork the worker's successor
// while the run goes on. A shorter run never wakes the zygote: it learns
// of the worker's exit and replaces it then, without sharing the CPU with
// the run. (zygote.py's BUSY_PREFORK_AFTER is the same for forks on
// demand.)
const busyPreforkAfter = 100 * time.Millisecond

// startRun gives a run for f (fds: payload, stdout, stderr, result; the
// caller keeps and closes them) to a pre-forked worker, or to a fresh one.
// stop must be called once the run is over.
func (z *zygote) startRun(ctx context.Context, f runFor, fds []int) (c *child, stop func(), err error) {
	rights := unix.UnixRights(fds...)
	msg := runMessage(f)
	for {
		z.mu.Lock()
		if len(z.idle) == 0 {
			z.mu.Unlock()
			break
		}
		w := z.idle[0]
		z.idle = z.idle[1:]
		z.mu.Unlock()
		// The channel is empty, so this never blocks; it fails if the worker
		// died while idle (its exit message is on its way).
		err := unix.Sendmsg(w.ch, msg, rights, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		unix.Close(w.ch)
		if err != nil {
			z.log.Debug("pre-forked worker gone", "pid", w.c.pid, "err", err)
			continue
		}
		// The run is the worker's now: if the zygote is dying, its death
		// ends the run (which must not run twice).
		pid := w.c.pid
		t := time.AfterFunc(busyPreforkAfter, func() {
			took, _ := json.Marshal(map[string]any{"op": "took", "pid": pid})
			_, _ = z.conn.Write(took)
		})
		return w.c, func() { t.Stop() }, nil
	}
	c, err = z.spawn(ctx, kindRun, f, fds)
	return c, func() {}, err
}

// dropIdleLocked forgets the idle worker pid (it died), if it is one.
func (z *zygote) dropIdleLocked(pid int) {
	for i, w := range z.idle {
		if w.c.pid == pid {
			unix.Close(w.ch)
			z.idle = append(z.idle[:i], z.idle[i+1:]...)
			return
		}
	}
}

// pidfdFile returns a duplicate of the child's pidfd, non-blocking so that
// os.File puts it in the runtime's poller (a pidfd polls readable once its
// process has exited), or nil without one.
func (c *child) pidfdFile() *os.File {
	c.mu.Lock()
	fd := -1
	if !c.gone && c.pidfd >= 0 {
		fd, _ = unix.FcntlInt(uintptr(c.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	}
	c.mu.Unlock()
	if fd < 0 {
		return nil
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil
	}
	return os.NewFile(uintptr(fd), "pidfd")
}

// pidfdExited polls a pidfd without blocking.
func pidfdExited(fd int) bool {
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(p, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err == nil && n > 0 && p[0].Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR) != 0
	}
}

// runEnded returns a channel closed when the run in c is over: when the
// zygote reports the exit, or sooner (the zygote has to be scheduled, reap
// and write), when the pidfd shows the exit, the result ends with the
// worker's NUL (it only exited after that, with the result's exit code)
// and the OOM killer did nothing meanwhile. The exit of a namespace's PID
// 1 shows only after the kernel has killed and reaped every other process
// of the namespace, so nothing the run started is left by then. A kill
// (timeout, cancellation) always waits for the zygote's report: no NUL.
func (e *execution) runEnded(c *child, rd *readers) <-chan struct{} {
	f := c.pidfdFile()
	if f == nil {
		return c.exited
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return c.exited
	}
	ended := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		// Closing the pidfd ends the Read below if the zygote's report
		// comes first.
		select {
		case <-c.exited:
		case <-watched:
		}
		f.Close()
	}()
	go func() {
		defer close(ended)
		err := rc.Read(func(fd uintptr) bool { return pidfdExited(int(fd)) })
		close(watched)
		if err != nil {
			<-c.exited
			return
		}
		// Everything the run started is gone, so the result pipe's EOF is
		// immediate (unless a descriptor leaked somewhere).
		select {
		case <-c.exited:
			return
		case <-rd.resultDone:
		}
		if _, clean := cleanResult(rd.result); clean && e.s.cg.oomKills() == e.oomBefore {
			return
		}
		<-c.exited
	}()
	return ended
}

// cleanResult strips the NUL a run worker writes after its result once it
// has nothing left to do but exit with the result's exit code.
func cleanResult(b []byte) ([]byte, bool) {
	if n := len(b); n > 1 && b[n-1] == 0 && b[0] == '{' {
		return b[:n-1], true
	}
	return b, false
}
