package executor

import (
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

// TestDownloadAsOpened: a file that grows between its open and its
// serving is served as it was opened, at the size its description says
// (a download through the executor while code appended to the file was
// once announced at one size and described at another).
func TestDownloadAsOpened(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "grow")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("0123456789")
	a := &asOpened{file: f, size: 5}
	f.WriteString("more") // appended after the open
	if end, err := a.Seek(0, io.SeekEnd); err != nil || end != 5 {
		t.Fatalf("end %d, %v; want 5", end, err)
	}
	if _, err := a.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(a)
	if err != nil || string(b) != "01234" {
		t.Fatalf("read %q, %v", b, err)
	}
	// A file cut shorter than it was opened at is no good body.
	short := &asOpened{file: strings.NewReader("012"), size: 5}
	if _, err := io.ReadAll(short); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a file cut short: %v", err)
	}
}
