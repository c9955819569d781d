package workspace

import (
	"context"
	"strings"
	"testing"
)

// FuzzWorkspacePaths sends arbitrary paths through every operation on a
// workspace full of links out to a sentinel directory: the sentinel must
// stay as it was, and every failure must be a client error.
func FuzzWorkspacePaths(f *testing.F) {
	for _, s := range []string{
		"", ".", "real/a.txt", "absdir/secret", "reldir/sub/f", "nested/up/secret", "nested/up/../x",
		"absfile", "relfile", "loop/x", "fifo", "fifo/x", "inlink/deep", "nested/back/a.txt",
		"../outside/secret", "/tmp", "uploads/c1/temparea/x", "real/a.txt/x", "a\\..\\b", "x\x00y",
	} {
		f.Add(s, uint8(0))
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, p string, flags uint8) {
		e := newEnv(t)
		e.plant(t)
		want := tree(t, e.outside)
		recursive := flags&1 != 0
		check := func(op string, err error) {
			if err != nil && !clientError(err) {
				t.Errorf("%s %q: internal error %v", op, p, err)
			}
		}
		_, err := e.w.Save(ctx, p, strings.NewReader("pwned"), 1<<10)
		check("save", err)
		file, err := e.w.Open(context.Background(), p)
		if err == nil {
			file.Close()
		}
		check("open", err)
		_, _, err = e.w.List(context.Background(), p, recursive, 100)
		check("list", err)
		check("remove", e.w.Remove(context.Background(), p, recursive))
		if flags&2 != 0 {
			check("remove conversation", e.w.RemoveConversation(context.Background(), p))
		}
		e.checkOutside(t, want)
	})
}
