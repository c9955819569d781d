package executor

import (
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// RotatingFile is a log file that never grows past max bytes: a write that
// would take it past max first renames it to path.1 (replacing the older
// one) and starts a new one. The executor's log and the zygote's stderr
// (which the template's code writes) go there, so together they take at
// most twice max of the control directory's tmpfs.
type RotatingFile struct {
	mu   sync.Mutex
	path string
	max  int64
	f    *os.File
	size int64
}

// OpenRotating opens (appends to) path, rotating at max bytes.
func OpenRotating(path string, max int64) (*RotatingFile, error) {
	if max <= 0 {
		return nil, fmt.Errorf("log file %s: max %d must be positive", path, max)
	}
	r := &RotatingFile{path: path, max: max}
	if err := r.open(os.O_APPEND); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *RotatingFile) open(mode int) error {
	f, err := os.OpenFile(r.path, os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW|mode, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	r.f, r.size = f, fi.Size()
	return nil
}

// Write writes p, rotating first if p does not fit. Of a single write
// larger than max only its last max bytes are kept.
func (r *RotatingFile) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(p)
	if int64(len(p)) > r.max {
		p = p[int64(len(p))-r.max:]
	}
	if r.size+int64(len(p)) > r.max && r.size > 0 {
		r.f.Close()
		if err := os.Rename(r.path, r.path+".1"); err != nil {
			return 0, err
		}
		if err := r.open(os.O_TRUNC); err != nil {
			return 0, err
		}
	}
	k, err := r.f.Write(p)
	r.size += int64(k)
	if err != nil {
		return k, err
	}
	return n, nil
}

// Close closes the current file.
func (r *RotatingFile) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.f.Close()
}

// RedirectOutput points this process's stdout and stderr (and so those of
// every child that inherits them: the zygote's shim, the zygote) at a pipe
// whose other end is copied into w. It returns a descriptor of what
// stderr was before, for the last words of a process whose log may not be
// read (the copy is a goroutine, which exit does not wait for).
func RedirectOutput(w io.Writer) (*os.File, error) {
	orig, err := unix.FcntlInt(2, unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, fmt.Errorf("dup stderr: %w", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		unix.Close(orig)
		return nil, err
	}
	for _, fd := range []int{1, 2} {
		if err := unix.Dup2(int(pw.Fd()), fd); err != nil {
			unix.Close(orig)
			pr.Close()
			pw.Close()
			return nil, fmt.Errorf("dup2 %d: %w", fd, err)
		}
	}
	pw.Close()
	go func() {
		// Never stop reading: with nobody at the other end, a write to
		// stderr would kill its writer with SIGPIPE. A write to the log
		// that fails (its tmpfs full) loses that piece of the log.
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return os.NewFile(uintptr(orig), "stderr"), nil
}
