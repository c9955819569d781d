package store_test

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func FuzzPageToken(f *testing.F) {
	f.Add(int64(1740830400123456), "sess-1", "")
	f.Add(int64(-1), "a:b", "MTIzOng")
	f.Add(int64(0), "é", "!!!")
	f.Fuzz(func(t *testing.T, us int64, id, tok string) {
		// Any string decodes to a position or ErrInvalidArgument.
		if _, _, err := store.DecodePageToken(tok); err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("DecodePageToken(%q) = %v, want ErrInvalidArgument", tok, err)
		}
		if id == "" {
			return
		}
		at := time.UnixMicro(us).UTC()
		gotAt, gotID, err := store.DecodePageToken(store.EncodePageToken(at, id))
		if err != nil || !gotAt.Equal(at) || gotID != id {
			t.Errorf("round trip of (%v, %q) = (%v, %q), %v", at, id, gotAt, gotID, err)
		}
	})
}

func TestPageSize(t *testing.T) {
	for _, tc := range []struct {
		in, want int
		err      error
	}{
		{0, store.DefaultPageSize, nil},
		{1, 1, nil},
		{store.MaxPageSize, store.MaxPageSize, nil},
		{-1, 0, errdefs.ErrInvalidArgument},
		{store.MaxPageSize + 1, 0, errdefs.ErrInvalidArgument},
	} {
		if got, err := store.PageSize(tc.in); got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("PageSize(%d) = %d, %v; want %d, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
