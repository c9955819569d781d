package fs_test

import (
	"testing"

	"github.com/sbx-sandbox/sbx/internal/blob"
	"github.com/sbx-sandbox/sbx/internal/blob/blobtest"
	"github.com/sbx-sandbox/sbx/internal/blob/fs"
)

func TestConformance(t *testing.T) {
	blobtest.Run(t, func(t *testing.T) blob.Store {
		s, err := fs.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
