package client

import (
	"bufio"
	"bytes"
	"io"
	"strings"
)

// maxSSELine bounds one line of an event stream. A result event carries
// the whole output (the server caps it), so the bound is generous.
const maxSSELine = 512 << 20

// sseEvent is one server-sent event.
type sseEvent struct {
	name string // "message" when the event names none
	data string // its data lines, joined with "\n"
	id   string // the last event id of the stream so far
}

// sseReader reads server-sent events as the HTML standard defines them:
// lines end in LF, CRLF or CR; a line starting with ":" is a comment;
// "field: value" (one space after the colon dropped); data lines of one
// event are joined with LF; an empty line ends an event; an event without
// data is none; the unfinished event at the end of the stream is dropped.
type sseReader struct {
	sc      *bufio.Scanner
	started bool
	// lastID is the stream's last event id: set by every "id" field, also
	// of a block without data (which is no event), and kept across
	// events, as the standard says; a reconnection sends it.
	lastID string
}

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxSSELine)
	sc.Split(scanSSELines)
	return &sseReader{sc: sc}
}

// next returns the next event, or io.EOF at the end of the stream.
func (r *sseReader) next() (sseEvent, error) {
	var (
		name    string
		data    strings.Builder
		hasData bool
	)
	for r.sc.Scan() {
		line := r.sc.Text()
		if !r.started {
			line = strings.TrimPrefix(line, "\uFEFF") // a byte order mark may start the stream
			r.started = true
		}
		if line == "" {
			if !hasData {
				name = ""
				continue
			}
			if name == "" {
				name = "message"
			}
			return sseEvent{name: name, data: data.String(), id: r.lastID}, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			name = value
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			hasData = true
		case "id":
			if !strings.ContainsRune(value, 0) {
				r.lastID = value
			}
		}
		// retry is the server's advice on reconnecting, which the event
		// streams' reader does on its own terms; other fields are
		// ignored, as the standard says.
	}
	if err := r.sc.Err(); err != nil {
		return sseEvent{}, err
	}
	return sseEvent{}, io.EOF
}

// scanSSELines splits at LF, CRLF or CR.
func scanSSELines(data []byte, atEOF bool) (int, []byte, error) {
	i := bytes.IndexAny(data, "\r\n")
	switch {
	case i < 0:
		if atEOF && len(data) > 0 {
			return len(data), data, nil
		}
		return 0, nil, nil
	case data[i] == '\n':
		return i + 1, data[:i], nil
	case i+1 < len(data):
		if data[i+1] == '\n' {
			return i + 2, data[:i], nil
		}
		return i + 1, data[:i], nil
	case atEOF:
		return i + 1, data[:i], nil
	default:
		return 0, nil, nil // a CR at the end: is an LF next?
	}
}
