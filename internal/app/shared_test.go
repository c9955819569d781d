package app

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
)

// TestSharedDeploymentValues: replicas with data directories of their own
// agree on the first one's value, and keep agreeing.
func TestSharedDeploymentValues(t *testing.T) {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "sbx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := shared(t.Context(), st, "signing-key", []byte("first replica's key, 32 bytes..."))
	if err != nil {
		t.Fatal(err)
	}
	b, err := shared(t.Context(), st, "signing-key", []byte("second replica's key, 32 bytes.."))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) || string(a) != "first replica's key, 32 bytes..." {
		t.Fatalf("replicas disagree: %q, %q", a, b)
	}
	c, err := shared(t.Context(), st, "instance-id", []byte("0123456789abcdef"))
	if err != nil || string(c) != "0123456789abcdef" {
		t.Fatalf("another key: %q, %v", c, err)
	}
}
