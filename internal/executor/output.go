package executor

import (
	"fmt"
	"io"
	"sync"
	"unicode/utf8"
)

// Output streams of an execution, as indexes into capture's arrays.
const (
	streamStdout = 0
	streamStderr = 1
)

var streamNames = [2]string{"stdout", "stderr"}

// splitUTF8 cuts b before an incomplete UTF-8 sequence at its very end and
// returns both parts: complete can be sent now, tail must wait for the
// bytes that finish it. Invalid bytes are not held back (they can never
// become valid); the JSON encoder turns them into U+FFFD.
func splitUTF8(b []byte) (complete, tail []byte) {
	// A sequence is at most 4 bytes, so its start is among the last 3.
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i], b[i:]
			}
			break
		}
	}
	return b, nil
}

// truncationMarker is the line that ends output cut at its limit.
func truncationMarker(omitted int64) string {
	return fmt.Sprintf("[sbx: output truncated, %d bytes omitted]\n", omitted)
}

// maxSegments bounds how much ordering between stdout and stderr capture
// remembers for a slow client; past it, order between the streams becomes
// approximate (within a stream it is always exact).
const maxSegments = 1024

// capture collects an execution's stdout and stderr: the text kept for the
// result (at most limit bytes per stream) and the part not yet streamed to
// the client. Its memory is bounded by the limits whatever the process
// writes and however slowly the client reads, because what is streamed is
// a window into what is kept: nothing is queued twice.
type capture struct {
	limit  int
	notify chan struct{} // a token whenever there is something to stream

	mu      sync.Mutex
	streams [2]streamBuf
	// segs is the order in which the streams received data since the last
	// take: each entry says "stream s has data up to offset end".
	segs []segment
}

type streamBuf struct {
	buf       []byte
	total     int64 // bytes the process wrote, kept or not
	truncated bool
	sent      int // bytes of buf already handed out by take
}

type segment struct {
	stream int
	end    int
}

func newCapture(limit int64) *capture {
	return &capture{limit: int(limit), notify: make(chan struct{}, 1)}
}

// write adds p, which the process wrote to stream, keeping what fits.
func (c *capture) write(stream int, p []byte) {
	c.mu.Lock()
	sb := &c.streams[stream]
	sb.total += int64(len(p))
	if sb.truncated || len(p) == 0 {
		c.mu.Unlock()
		return
	}
	room := c.limit - len(sb.buf)
	if len(p) > room {
		sb.buf = appendCapped(sb.buf, p[:room], c.limit)
		// Cut at a character boundary, so that the kept text stays UTF-8.
		sb.buf, _ = splitUTF8(sb.buf)
		sb.truncated = true
	} else {
		sb.buf = appendCapped(sb.buf, p, c.limit)
	}
	end := len(sb.buf)
	switch n := len(c.segs); {
	case n > 0 && c.segs[n-1].stream == stream:
		c.segs[n-1].end = end
	case n < maxSegments:
		c.segs = append(c.segs, segment{stream, end})
	default:
		for i := n - 1; i >= 0; i-- {
			if c.segs[i].stream == stream {
				c.segs[i].end = end
				break
			}
		}
	}
	c.mu.Unlock()
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// appendCapped is append that never grows the buffer beyond limit, so that
// a 64 MiB limit does not allocate 80 MiB.
func appendCapped(buf, p []byte, limit int) []byte {
	if need := len(buf) + len(p); need > cap(buf) {
		n := max(2*cap(buf), need, 4096)
		n = min(n, max(limit, need))
		nb := make([]byte, len(buf), n)
		copy(nb, buf)
		buf = nb
	}
	return append(buf, p...)
}

// chunk is a piece of output ready to be sent as an event.
type chunk struct {
	stream int
	data   string
}

// take returns the output not yet handed out, in order. It holds back an
// incomplete UTF-8 sequence at the end of a stream until its rest arrives,
// unless final, when everything goes, ended by the truncation markers.
func (c *capture) take(final bool) []chunk {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []chunk
	emit := func(stream, end int, all bool) {
		sb := &c.streams[stream]
		if end <= sb.sent {
			return
		}
		data := sb.buf[sb.sent:end]
		if !all {
			data, _ = splitUTF8(data)
		}
		if len(data) == 0 {
			return
		}
		out = append(out, chunk{stream, string(data)})
		sb.sent += len(data)
	}
	for _, s := range c.segs {
		emit(s.stream, s.end, false)
	}
	c.segs = c.segs[:0]
	if final {
		for i := range c.streams {
			emit(i, len(c.streams[i].buf), true)
			if sb := &c.streams[i]; sb.truncated {
				out = append(out, chunk{i, markerPrefix(sb.buf) + truncationMarker(sb.total-int64(len(sb.buf)))})
			}
		}
	}
	return out
}

// markerPrefix starts the marker on a line of its own.
func markerPrefix(buf []byte) string {
	if len(buf) > 0 && buf[len(buf)-1] != '\n' {
		return "\n"
	}
	return ""
}

// text is the captured text of stream for the result, with its marker.
func (c *capture) text(stream int) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sb := &c.streams[stream]
	if !sb.truncated {
		return string(sb.buf), false
	}
	return string(sb.buf) + markerPrefix(sb.buf) + truncationMarker(sb.total-int64(len(sb.buf))), true
}

// readBufSize is the size of each pipe read; the buffer is reused, so a run
// that prints 100 MB allocates it once, and pooled, so that runs do not
// allocate 128 KiB each (garbage collections are thread switches, which
// are slow on a paravirtualized machine).
const readBufSize = 64 << 10

var readBufs = sync.Pool{New: func() any { return new([readBufSize]byte) }}

// drain copies r into stream until EOF or error. It never blocks on the
// client: the process is never slowed down by a slow reader, and output
// beyond the limit is read and dropped.
func (c *capture) drain(stream int, r io.Reader) {
	b := readBufs.Get().(*[readBufSize]byte)
	defer readBufs.Put(b)
	buf := b[:]
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.write(stream, buf[:n])
		}
		if err != nil {
			return
		}
	}
}
