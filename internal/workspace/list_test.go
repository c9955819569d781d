package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestList(t *testing.T) {
	e := newEnv(t)
	e.plant(t)
	types := func(ents []Entry) string {
		var s []string
		for _, e := range ents {
			s = append(s, e.Path+":"+e.Type)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		path      string
		recursive bool
		want      string
	}{
		{"", false, "absdir:symlink absfile:symlink fifo:other infile:symlink inlink:symlink loop:symlink nested:dir real:dir reldir:symlink relfile:symlink uploads:dir"},
		{"real", false, "real/a.txt:file real/deep:dir"},
		{"real", true, "real/a.txt:file real/deep:dir real/deep/b.txt:file"},
		{"inlink", true, "inlink/a.txt:file inlink/deep:dir inlink/deep/b.txt:file"},
		{"nested", true, "nested/back:symlink nested/up:symlink"},
		{"real/a.txt", false, "real/a.txt:file"},
		{"infile", true, "infile:file"},
		{".", true, "absdir:symlink absfile:symlink fifo:other infile:symlink inlink:symlink loop:symlink " +
			"nested:dir nested/back:symlink nested/up:symlink real:dir real/a.txt:file real/deep:dir real/deep/b.txt:file " +
			"reldir:symlink relfile:symlink uploads:dir"},
	} {
		t.Run(fmt.Sprintf("%s %v", tc.path, tc.recursive), func(t *testing.T) {
			ents, truncated, err := e.w.List(context.Background(), tc.path, tc.recursive, 0)
			if err != nil || truncated {
				t.Fatalf("List = %v, %v", truncated, err)
			}
			if got := types(ents); got != tc.want {
				t.Errorf("List(%q, %v) =\n %s\nwant\n %s", tc.path, tc.recursive, got, tc.want)
			}
		})
	}
	t.Run("entry", func(t *testing.T) {
		ents, _, err := e.w.List(context.Background(), "real/deep/b.txt", false, 0)
		if err != nil {
			t.Fatal(err)
		}
		if g := ents[0]; g.Name != "b.txt" || g.Size != 2 || g.Mode != 0o644 || g.ModTime.IsZero() {
			t.Errorf("entry %+v", g)
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, _, err := e.w.List(context.Background(), "nope", true, 0); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("List(nope) = %v, want ErrNotFound", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		ents, _, err := e.w.List(context.Background(), "uploads", true, 0)
		if err != nil || ents == nil || len(ents) != 0 {
			t.Errorf("List(uploads) = %#v, %v; want an empty, non-nil list", ents, err)
		}
	})
}

func TestListTruncated(t *testing.T) {
	e := newEnv(t)
	d := e.w.Dir()
	mustMkdir(t, filepath.Join(d, "flat"))
	for i := range 30 {
		mustWrite(t, filepath.Join(d, "flat", fmt.Sprintf("f%02d", i)), "")
	}
	mustMkdir(t, filepath.Join(d, "tree", "a", "b", "c"))
	mustWrite(t, filepath.Join(d, "tree", "top"), "")
	mustWrite(t, filepath.Join(d, "tree", "a", "b", "c", "bottom"), "")
	for _, tc := range []struct {
		path      string
		recursive bool
		max       int
		n         int
		truncated bool
	}{
		{"flat", false, 10, 10, true},
		{"flat", false, 29, 29, true},
		{"flat", false, 30, 30, false},
		{"flat", true, 31, 30, false},
		{"tree", true, 5, 5, false},
		{"tree", true, 4, 4, true},
		{"tree", true, 2, 2, true},
		{"tree", false, 1, 1, true},
	} {
		t.Run(fmt.Sprintf("%s %v %d", tc.path, tc.recursive, tc.max), func(t *testing.T) {
			ents, truncated, err := e.w.List(context.Background(), tc.path, tc.recursive, tc.max)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != tc.n || truncated != tc.truncated {
				t.Errorf("%d entries, truncated %v; want %d, %v", len(ents), truncated, tc.n, tc.truncated)
			}
		})
	}
	t.Run("shallowest first", func(t *testing.T) {
		ents, _, _ := e.w.List(context.Background(), "tree", true, 2)
		if got := paths(ents); got != "tree/a tree/top" {
			t.Errorf("List = %s", got)
		}
	})
}

func TestUsage(t *testing.T) {
	e := newEnv(t)
	e.plant(t) // a.txt (1), b.txt (2), links and a FIFO
	bytes, files, err := e.w.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// 2 regular files, 9 links, 1 FIFO; links are not followed.
	if bytes != 3 || files != 12 {
		t.Errorf("Usage = %d bytes, %d files; want 3, 12", bytes, files)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := e.w.Usage(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Usage(cancelled) = %v", err)
	}
}

// TestSwapRace has a "sandbox" swap a directory for a link out and back
// as fast as it can while every operation runs on paths through it. None
// may touch the outside or fail with an internal error.
func TestSwapRace(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	d := e.w.Dir()
	victim := filepath.Join(d, "victim")
	mustMkdir(t, filepath.Join(victim, "sub"))
	mustWrite(t, filepath.Join(victim, "secret"), "inside")
	want := tree(t, e.outside)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Rename(victim, victim+".real")
			os.Symlink(e.outside, victim)
			os.Remove(victim)
			os.Symlink("../../outside", victim)
			os.Remove(victim)
			os.Rename(victim+".real", victim)
		}
	}()
	var errs []error
	for i := range 500 {
		p := []string{"victim/secret", "victim/sub/new", "victim/sub"}[i%3]
		if _, err := e.w.Save(ctx, p, strings.NewReader("pwned"), 0); err != nil {
			errs = append(errs, err)
		}
		if f, err := e.w.Open(context.Background(), p); err == nil {
			f.Close()
		} else {
			errs = append(errs, err)
		}
		if _, _, err := e.w.List(context.Background(), "victim", true, 0); err != nil {
			errs = append(errs, err)
		}
		if err := e.w.Remove(context.Background(), p, i%2 == 0); err != nil {
			errs = append(errs, err)
		}
		if _, _, err := e.w.Usage(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	close(stop)
	wg.Wait()
	e.checkOutside(t, want)
	for _, err := range errs {
		if !clientError(err) {
			t.Errorf("internal error: %v", err)
		}
	}
}
