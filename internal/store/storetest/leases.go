package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

// long is a ttl no test outlives: a lease taken with it is held for the
// whole test, however slow the machine.
const long = time.Hour

// tryLease calls TryLease and fails the test on an error.
func tryLease(t *testing.T, s store.Store, name, holder string, ttl time.Duration) (int64, bool) {
	t.Helper()
	token, held, err := s.TryLease(ctx, name, holder, ttl)
	if err != nil {
		t.Fatalf("TryLease(%q, %q) = %v", name, holder, err)
	}
	if !held && token != 0 {
		t.Errorf("TryLease(%q, %q) = token %d, not held; want token 0", name, holder, token)
	}
	return token, held
}

// testLeaseOneHolder: of many takers of a free lease at once, one gets
// it; the others get it neither then nor when they try again.
func testLeaseOneHolder(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	const n = 16
	type result struct {
		token int64
		held  bool
		err   error
	}
	race := func() []result {
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			out   = make([]result, n)
		)
		for i := range n {
			wg.Go(func() {
				<-start
				r := &out[i]
				r.token, r.held, r.err = s.TryLease(ctx, "reaper", fmt.Sprintf("server-%d", i), long)
			})
		}
		close(start)
		wg.Wait()
		return out
	}
	holder := -1
	for i, r := range race() {
		switch {
		case r.err != nil:
			t.Errorf("server-%d: TryLease = %v", i, r.err)
		case r.held && holder >= 0:
			t.Errorf("server-%d and server-%d both hold the lease", holder, i)
		case r.held:
			holder = i
			if r.token != 1 {
				t.Errorf("the first holding's token = %d, want 1", r.token)
			}
		}
	}
	if holder < 0 {
		t.Fatalf("none of %d servers got a free lease", n)
	}
	// Again, all at once: the holder renews it, the rest still cannot
	// have it.
	for i, r := range race() {
		if r.err != nil || r.held != (i == holder) || (r.held && r.token != 1) {
			t.Errorf("second round, server-%d: TryLease = %d, %v, %v; holder is server-%d with token 1", i, r.token, r.held, r.err, holder)
		}
	}
	// Names are independent.
	if token, held := tryLease(t, s, "other", "server-x", long); !held || token != 1 {
		t.Errorf("another lease's first holding = %d, %v; want 1, held", token, held)
	}
}

// testLeaseRenewal: the holder renews its lease as often as it likes,
// keeping its token.
func testLeaseRenewal(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	first, held := tryLease(t, s, "l", "a", long)
	if !held {
		t.Fatal("a free lease was not taken")
	}
	for range 3 {
		if token, held := tryLease(t, s, "l", "a", long); !held || token != first {
			t.Errorf("renewal = %d, %v; want %d, held", token, held, first)
		}
	}
	if _, held := tryLease(t, s, "l", "b", long); held {
		t.Error("another holder took a renewed lease")
	}
}

// testLeaseExpiry: a lease its holder does not renew passes to another
// when its ttl runs out, with a larger token, and the old holder has lost
// it.
func testLeaseExpiry(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	const ttl = 200 * time.Millisecond
	first, held := tryLease(t, s, "l", "a", ttl)
	if !held {
		t.Fatal("a free lease was not taken")
	}
	// Poll rather than sleep a guess: b has it as soon as a's ends.
	deadline := time.Now().Add(time.Minute)
	var second int64
	for {
		if second, held = tryLease(t, s, "l", "b", long); held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a lease of %v was still held a minute later", ttl)
		}
		time.Sleep(ttl / 10)
	}
	if second <= first {
		t.Errorf("the token after the lease passed on = %d, want more than the first holder's %d", second, first)
	}
	if token, held := tryLease(t, s, "l", "a", long); held {
		t.Errorf("the old holder renewed a lease that passed on: token %d", token)
	}
	if token, held := tryLease(t, s, "l", "b", long); !held || token != second {
		t.Errorf("the new holder's renewal = %d, %v; want %d, held", token, held, second)
	}
}

// testLeaseRelease: a released lease is another's at once, with a larger
// token; only the holder can release it.
func testLeaseRelease(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	first, held := tryLease(t, s, "l", "a", long)
	if !held {
		t.Fatal("a free lease was not taken")
	}
	// Releasing another's lease, or one never taken, does nothing.
	for _, c := range [][2]string{{"l", "b"}, {"nope", "a"}} {
		if err := s.ReleaseLease(ctx, c[0], c[1]); err != nil {
			t.Errorf("ReleaseLease(%q, %q) = %v, want nil", c[0], c[1], err)
		}
	}
	if _, held := tryLease(t, s, "l", "b", long); held {
		t.Fatal("b released a's lease")
	}
	if err := s.ReleaseLease(ctx, "l", "a"); err != nil {
		t.Fatalf("ReleaseLease = %v", err)
	}
	second, held := tryLease(t, s, "l", "b", long)
	if !held || second <= first {
		t.Fatalf("TryLease after release = %d, %v; want held with a token over %d", second, held, first)
	}
	// Back to a: the token grows again, never reused.
	if err := s.ReleaseLease(ctx, "l", "b"); err != nil {
		t.Fatal(err)
	}
	if third, held := tryLease(t, s, "l", "a", long); !held || third <= second {
		t.Errorf("TryLease by the first holder after b's release = %d, %v; want held with a token over %d", third, held, second)
	}
}

func testLeaseErrors(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for _, tc := range []struct {
		name, holder string
		ttl          time.Duration
	}{
		{"", "a", long},
		{"l", "", long},
		{"l", "a", 0},
		{"l", "a", -time.Second},
	} {
		if _, held, err := s.TryLease(ctx, tc.name, tc.holder, tc.ttl); !errors.Is(err, errdefs.ErrInvalidArgument) || held {
			t.Errorf("TryLease(%q, %q, %v) = %v, %v; want ErrInvalidArgument", tc.name, tc.holder, tc.ttl, held, err)
		}
	}
	for _, c := range [][2]string{{"", "a"}, {"l", ""}} {
		if err := s.ReleaseLease(ctx, c[0], c[1]); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ReleaseLease(%q, %q) = %v, want ErrInvalidArgument", c[0], c[1], err)
		}
	}
	// The refused calls took nothing.
	if token, held := tryLease(t, s, "l", "b", long); !held || token != 1 {
		t.Errorf("TryLease after refused calls = %d, %v; want 1, held", token, held)
	}
}

// testLeaseHolder: who holds a lease, and whether it is live, for a lease
// never taken, held, released and expired.
func testLeaseHolder(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	holder := func(name string) (string, bool) {
		t.Helper()
		h, live, err := s.LeaseHolder(ctx, name)
		if err != nil {
			t.Fatalf("LeaseHolder(%q) = %v", name, err)
		}
		return h, live
	}
	if h, live := holder("l"); h != "" || live {
		t.Errorf("a lease never taken: %q, %v", h, live)
	}
	tryLease(t, s, "l", "a", long)
	if h, live := holder("l"); h != "a" || !live {
		t.Errorf("a held lease: %q, %v; want a, live", h, live)
	}
	if err := s.ReleaseLease(ctx, "l", "a"); err != nil {
		t.Fatal(err)
	}
	if h, live := holder("l"); h != "a" || live {
		t.Errorf("a released lease: %q, %v; want a, not live", h, live)
	}
	tryLease(t, s, "m", "b", 50*time.Millisecond)
	deadline := time.Now().Add(time.Minute)
	for {
		h, live := holder("m")
		if h != "b" {
			t.Fatalf("an expiring lease's holder: %q", h)
		}
		if !live {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a lease of 50ms was live a minute later")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, err := s.LeaseHolder(ctx, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("LeaseHolder(\"\") = %v, want ErrInvalidArgument", err)
	}
}

// testLiveLeases: the live leases under a prefix, and only those: not
// released or expired ones, not a name that merely shares some letters.
func testLiveLeases(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	ctx := t.Context()
	live := func(prefix string) []string {
		t.Helper()
		names, err := s.LiveLeases(ctx, prefix)
		if err != nil {
			t.Fatalf("LiveLeases(%q) = %v", prefix, err)
		}
		return names
	}
	if got := live("files/"); len(got) != 0 {
		t.Errorf("no leases: %q", got)
	}
	for _, name := range []string{"files/t/s/b", "files/t/s/a", "files/t/s2/a", "files/t/sx", "filez/t/s/a", "files/t/s/é"} {
		tryLease(t, s, name, "h", long)
	}
	tryLease(t, s, "files/t/s/c", "h", long)
	if err := s.ReleaseLease(ctx, "files/t/s/c", "h"); err != nil {
		t.Fatal(err)
	}
	tryLease(t, s, "files/t/s/d", "h", time.Microsecond)
	time.Sleep(5 * time.Millisecond)
	if got, want := live("files/t/s/"), []string{"files/t/s/a", "files/t/s/b", "files/t/s/é"}; !slices.Equal(got, want) {
		t.Errorf("LiveLeases(files/t/s/) = %q, want %q", got, want)
	}
	if got := live("files/t/s2/"); !slices.Equal(got, []string{"files/t/s2/a"}) {
		t.Errorf("LiveLeases(files/t/s2/) = %q", got)
	}
	if got := live("files/t/s/%"); len(got) != 0 {
		t.Errorf("a prefix with a LIKE wildcard: %q", got)
	}
	if _, err := s.LiveLeases(ctx, ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("LiveLeases(\"\") = %v, want ErrInvalidArgument", err)
	}
}
