package executor

import (
	"errors"
	"testing"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A conversation id is the API caller's: each new one takes a group of
// the executor's for the Pod's life. The groups are bounded (they must
// fit the 65536 ids of a user-namespaced Pod); past the last, a new
// conversation is refused, and the ones that have a group keep it.
func TestPodViewGroupsAreBounded(t *testing.T) {
	v := newPodViews(t.TempDir())
	v.next = viewGIDEnd - 1
	gid, err := v.allocLocked("c1")
	if err != nil || gid != viewGIDEnd-1 {
		t.Fatalf("the last group: %d, %v", gid, err)
	}
	if _, err := v.allocLocked("c2"); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a group past the last: %v, want resource exhausted", err)
	}
	if len(v.gids) != 1 || v.gids["c1"] != viewGIDEnd-1 {
		t.Fatalf("groups %v", v.gids)
	}
	for _, bad := range []string{"", "temparea", "../x", ".hidden", "a/b"} {
		if err := checkConversation(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("conversation %q: %v, want invalid argument", bad, err)
		}
	}
}
