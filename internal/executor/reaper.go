package executor

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper is the one place where the executor waits for children.
//
// As PID 1 of the sandbox, every orphan in it is reparented to the
// executor and must be reaped, or zombies pile up to the pids limit. That
// takes wait4(-1), which would steal the status of any child someone else
// waits for; so the executor never uses os/exec (whose Wait would race with
// it) and starts its few children through reaper.start, which registers
// them before the reaper can see them exit.
//
// Outside PID 1 (tests on a host) the executor is a subreaper instead, and
// waits only for the pids it registered, so as not to steal the statuses of
// other children of the same process.
type reaper struct {
	all bool
	log *slog.Logger

	mu      sync.Mutex
	waiters map[int]func(unix.WaitStatus)
	own     map[int]bool // started by start and not reaped yet

	sig  chan os.Signal
	stop chan struct{}
	done chan struct{}
}

// newReaper starts the reaper. all selects wait4(-1) (PID 1).
func newReaper(all bool, log *slog.Logger) (*reaper, error) {
	if !all {
		// Children of a dead zygote must come to us, not to the host's init.
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("PR_SET_CHILD_SUBREAPER: %w", err)
		}
	}
	r := &reaper{
		all:     all,
		log:     log,
		waiters: make(map[int]func(unix.WaitStatus)),
		own:     make(map[int]bool),
		sig:     make(chan os.Signal, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	signal.Notify(r.sig, unix.SIGCHLD)
	go r.loop()
	return r, nil
}

// start runs fork (which must return the pid of a new child) with the
// reaper held, and registers onExit for that pid, so that the child cannot
// be reaped before anyone listens for it.
func (r *reaper) start(fork func() (int, error), onExit func(unix.WaitStatus)) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, err
	}
	r.waiters[pid] = onExit
	r.own[pid] = true
	return pid, nil
}

// started reports whether pid is a child start made that is not reaped
// yet.
func (r *reaper) started(pid int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.own[pid]
}

// adopt registers a process that became our child by reparenting (the
// children of a dead zygote), so that it is reaped once it dies.
func (r *reaper) adopt(pid int) {
	r.mu.Lock()
	if _, ok := r.waiters[pid]; !ok {
		r.waiters[pid] = nil
	}
	r.mu.Unlock()
	r.kick()
}

func (r *reaper) kick() {
	select {
	case r.sig <- unix.SIGCHLD:
	default:
	}
}

func (r *reaper) loop() {
	defer close(r.done)
	for {
		r.reap()
		select {
		case <-r.sig:
		case <-r.stop:
			return
		}
	}
}

type exited struct {
	fn func(unix.WaitStatus)
	ws unix.WaitStatus
}

func (r *reaper) reap() {
	var calls []exited
	r.mu.Lock()
	if r.all {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
			delete(r.own, pid)
			if fn, ok := r.waiters[pid]; ok {
				delete(r.waiters, pid)
				if fn != nil {
					calls = append(calls, exited{fn, ws})
				}
			}
		}
	} else {
		for pid, fn := range r.waiters {
			var ws unix.WaitStatus
			got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
			switch {
			case got == pid:
			case errors.Is(err, unix.ECHILD):
				// Not (or no longer) our child: nobody will ever report it.
				r.log.Warn("tracked process is not our child", "pid", pid)
				ws = unix.WaitStatus(0xff << 8)
			default:
				continue
			}
			delete(r.waiters, pid)
			delete(r.own, pid)
			if fn != nil {
				calls = append(calls, exited{fn, ws})
			}
		}
	}
	r.mu.Unlock()
	for _, c := range calls {
		c.fn(c.ws)
	}
}

// close stops the reaper. Children still running are not waited for.
func (r *reaper) close() {
	signal.Stop(r.sig)
	close(r.stop)
	<-r.done
}
