package store

import (
	"fmt"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// CheckLease checks the name and holder of a lease call.
func CheckLease(name, holder string) error {
	switch {
	case name == "":
		return fmt.Errorf("lease: name is required: %w", errdefs.ErrInvalidArgument)
	case holder == "":
		return fmt.Errorf("lease %q: holder is required: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// LeaseMicros checks a lease's ttl and returns it in whole microseconds,
// rounded up (a positive ttl never becomes 0): what the backends keep.
func LeaseMicros(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("lease ttl %v: want more than 0: %w", ttl, errdefs.ErrInvalidArgument)
	}
	us := ttl.Microseconds()
	if ttl%time.Microsecond != 0 {
		us++
	}
	return us, nil
}
