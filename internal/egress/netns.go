// Package egress is the way out of a network namespace that has none: a
// fresh namespace with only loopback, and a proxy whose listener sits on
// that loopback while the proxy itself runs in sbx, on the host's network,
// and lets through only what its allow list names.
//
// A template build uses it to reach its Debian mirror and nothing else
// (internal/template): the build's container joins the namespace, apt
// talks to the proxy on 127.0.0.1, and the proxy dials the mirror.
package egress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace with loopback up and nothing else, and a
// TCP listener on its 127.0.0.1 whose connections arrive in this process.
// A container joins it through Path.
type NetNS struct {
	fd int
	// Listener accepts the connections made inside the namespace to
	// 127.0.0.1:Port.
	Listener net.Listener
	// Port is the listener's port inside the namespace.
	Port int
}

// NewNetNS makes a network namespace and a listener in it. It needs
// CAP_SYS_ADMIN. The namespace lives until Close and what joined it have
// all gone.
func NewNetNS() (*NetNS, error) {
	type result struct {
		n   *NetNS
		err error
	}
	ch := make(chan result, 1)
	// A namespace change is the calling thread's. This goroutine keeps its
	// thread locked to the end, so the Go runtime ends that thread with it
	// instead of handing a thread in another namespace to other goroutines.
	go func() {
		runtime.LockOSThread()
		n, err := newNetNS()
		ch <- result{n, err}
	}()
	r := <-ch
	return r.n, r.err
}

func newNetNS() (*NetNS, error) {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("egress: new network namespace: %w", err)
	}
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("egress: network namespace: %w", err)
	}
	if err := loopbackUp(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// The socket is made in this thread's namespace and stays there;
	// accepting on it works from any thread.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("egress: listener: %w", err)
	}
	return &NetNS{fd: fd, Listener: ln, Port: ln.Addr().(*net.TCPAddr).Port}, nil
}

// loopbackUp sets lo up in the calling thread's network namespace.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("egress: loopback: %w", err)
	}
	defer unix.Close(s)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("egress: loopback flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("egress: loopback up: %w", err)
	}
	return nil
}

// Path names the namespace for a process that joins it (an OCI runtime's
// namespace path): this process's descriptor of it.
func (n *NetNS) Path() string {
	return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(n.fd)
}

// Close closes the listener and this process's hold on the namespace.
func (n *NetNS) Close() error {
	err := n.Listener.Close()
	if cerr := unix.Close(n.fd); cerr != nil && !errors.Is(cerr, unix.EBADF) {
		err = errors.Join(err, cerr)
	}
	return err
}
