package store

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestLeaseMicros(t *testing.T) {
	for _, tc := range []struct {
		ttl  time.Duration
		want int64
	}{
		{time.Nanosecond, 1},
		{time.Microsecond, 1},
		{time.Microsecond + 1, 2},
		{200 * time.Millisecond, 200000},
		{math.MaxInt64, math.MaxInt64/1000 + 1},
	} {
		if got, err := LeaseMicros(tc.ttl); err != nil || got != tc.want {
			t.Errorf("LeaseMicros(%v) = %d, %v; want %d", tc.ttl, got, err, tc.want)
		}
	}
	for _, ttl := range []time.Duration{0, -1, math.MinInt64} {
		if _, err := LeaseMicros(ttl); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("LeaseMicros(%v) = %v, want ErrInvalidArgument", ttl, err)
		}
	}
}
