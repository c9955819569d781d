package app

import (
	"bytes"
	"path/filepath"
	"sync"
	"testing"
)

// Replicas starting at once on a new data directory end up with one
// signing key and one instance name, whoever makes them.
func TestSharedKeysMadeOnce(t *testing.T) {
	for range 20 {
		dir := t.TempDir()
		const n = 8
		keys, ids := make([][]byte, n), make([]string, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if keys[i], err = signingKey(filepath.Join(dir, "signing.key")); err != nil {
					t.Error(err)
				}
				if ids[i], err = instanceID(filepath.Join(dir, "instance.id")); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		for i := range n {
			if !bytes.Equal(keys[i], keys[0]) || len(keys[i]) != 32 {
				t.Fatalf("replica %d has signing key %x, replica 0 %x", i, keys[i], keys[0])
			}
			if ids[i] != ids[0] {
				t.Fatalf("replica %d has instance %q, replica 0 %q", i, ids[i], ids[0])
			}
		}
		again, err := signingKey(filepath.Join(dir, "signing.key"))
		if err != nil || !bytes.Equal(again, keys[0]) {
			t.Fatalf("read again: %x, %v", again, err)
		}
		if m, _ := filepath.Glob(filepath.Join(dir, ".signing.key-*")); len(m) > 0 {
			t.Fatalf("temporary files left: %v", m)
		}
	}
}
