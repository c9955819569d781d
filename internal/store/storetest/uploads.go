package storetest

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/store"
)

func upload(tenant, sessionID, path, conversationID string) *store.Upload {
	return &store.Upload{
		Tenant: tenant, SessionID: sessionID, Path: path, ConversationID: conversationID,
		Size: int64(len(path)), SHA256: fmt.Sprintf("%064x", len(path)), CreatedAt: t0,
	}
}

func uploadPaths(t *testing.T, s store.Store, tenant, sessionID, conversationID string) []string {
	t.Helper()
	list, err := s.ListUploads(ctx, tenant, sessionID, conversationID)
	if err != nil {
		t.Fatalf("ListUploads = %v", err)
	}
	paths := []string{}
	for _, u := range list {
		paths = append(paths, u.Path)
	}
	return paths
}

func testUploads(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	for _, u := range []*store.Upload{
		upload("t1", "s1", "z.txt", ""),
		upload("t1", "s1", "a.txt", ""),
		upload("t1", "s1", "uploads/c1/temparea/b.csv", "c1"),
		upload("t1", "s1", "uploads/c1/temparea/a.csv", "c1"),
		upload("t1", "s1", "uploads/c2/temparea/a.csv", "c2"),
		upload("t1", "s2", "a.txt", ""),
	} {
		if err := s.PutUpload(ctx, u); err != nil {
			t.Fatalf("PutUpload(%s) = %v", u.Path, err)
		}
	}
	// Putting a path again replaces its record.
	re := upload("t1", "s1", "a.txt", "")
	re.Size, re.SHA256, re.CreatedAt = 12345, "ab", t0.Add(time.Minute)
	if err := s.PutUpload(ctx, re); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListUploads(ctx, "t1", "s1", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Path != "a.txt" || list[1].Path != "z.txt" {
		t.Fatalf("session-level uploads = %v, want a.txt, z.txt", list)
	}
	if g := list[0]; g.Tenant != "t1" || g.SessionID != "s1" || g.ConversationID != "" || g.Size != 12345 || g.SHA256 != "ab" || !sameTime(g.CreatedAt, re.CreatedAt) {
		t.Errorf("replaced upload = %+v, want %+v", g, re)
	}
	for _, tc := range []struct {
		conversation string
		want         []string
	}{
		{"c1", []string{"uploads/c1/temparea/a.csv", "uploads/c1/temparea/b.csv"}},
		{"c2", []string{"uploads/c2/temparea/a.csv"}},
		{"c3", []string{}},
	} {
		if got := uploadPaths(t, s, "t1", "s1", tc.conversation); !slices.Equal(got, tc.want) {
			t.Errorf("ListUploads(%s) = %v, want %v", tc.conversation, got, tc.want)
		}
	}
	if n, err := s.CountUploads(ctx, "t1", "s1"); err != nil || n != 5 {
		t.Errorf("CountUploads = %d, %v; want 5", n, err)
	}

	if err := s.DeleteConversationUploads(ctx, "t1", "s1", "c1"); err != nil {
		t.Fatalf("DeleteConversationUploads = %v", err)
	}
	if got := uploadPaths(t, s, "t1", "s1", "c1"); len(got) != 0 {
		t.Errorf("c1's uploads after deleting them = %v", got)
	}
	if n, err := s.CountUploads(ctx, "t1", "s1"); err != nil || n != 3 {
		t.Errorf("CountUploads after deleting c1's = %d, %v; want 3", n, err)
	}
	if err := s.DeleteConversationUploads(ctx, "t1", "s1", "c1"); err != nil {
		t.Errorf("DeleteConversationUploads again = %v", err)
	}

	for _, tc := range []struct {
		name string
		err  error
	}{
		{"put nil", s.PutUpload(ctx, nil)},
		{"put without tenant", s.PutUpload(ctx, upload("", "s1", "p", ""))},
		{"put without session", s.PutUpload(ctx, upload("t1", "", "p", ""))},
		{"put without path", s.PutUpload(ctx, upload("t1", "s1", "", ""))},
		{"delete conversation \"\"", s.DeleteConversationUploads(ctx, "t1", "s1", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !errors.Is(tc.err, errdefs.ErrInvalidArgument) {
				t.Errorf("got %v, want ErrInvalidArgument", tc.err)
			}
		})
	}
	if n, _ := s.CountUploads(ctx, "t1", "s1"); n != 3 {
		t.Errorf("CountUploads after failed calls = %d, want 3", n)
	}
}

func testDeleteUploads(t *testing.T, open func(t *testing.T) store.Store) {
	// The neighbours of "a/" in byte order: "a-b" and "a.txt" sort just
	// before it and "a0" just after, so a prefix match done wrong shows.
	paths := []string{"a", "a-b", "a.txt", "a/b", "a/b/c", "a/bc", "a0", "ab", "b/a", "é/a"}
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"a", []string{"a-b", "a.txt", "a0", "ab", "b/a", "é/a"}},
		{"a/b", []string{"a", "a-b", "a.txt", "a/bc", "a0", "ab", "b/a", "é/a"}},
		{"a/b/c", []string{"a", "a-b", "a.txt", "a/b", "a/bc", "a0", "ab", "b/a", "é/a"}},
		{"b", []string{"a", "a-b", "a.txt", "a/b", "a/b/c", "a/bc", "a0", "ab", "é/a"}},
		{"é", []string{"a", "a-b", "a.txt", "a/b", "a/b/c", "a/bc", "a0", "ab", "b/a"}},
		{"nope", paths},
		{"a%", paths},
		{"a_", paths},
		{"", []string{}},
	} {
		t.Run(fmt.Sprintf("%q", tc.path), func(t *testing.T) {
			s := open(t)
			for _, p := range paths {
				for _, u := range []*store.Upload{upload("t1", "s1", p, ""), upload("t1", "s2", p, ""), upload("t2", "s1", p, "")} {
					if err := s.PutUpload(ctx, u); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := s.DeleteUploads(ctx, "t1", "s1", tc.path); err != nil {
				t.Fatalf("DeleteUploads = %v", err)
			}
			if got := uploadPaths(t, s, "t1", "s1", ""); !slices.Equal(got, tc.want) {
				t.Errorf("left %v\nwant %v", got, tc.want)
			}
			if n, err := s.CountUploads(ctx, "t1", "s1"); err != nil || n != len(tc.want) {
				t.Errorf("CountUploads = %d, %v; want %d", n, err, len(tc.want))
			}
			// Another session and another tenant's same session keep theirs.
			for _, k := range [][2]string{{"t1", "s2"}, {"t2", "s1"}} {
				if got := uploadPaths(t, s, k[0], k[1], ""); !slices.Equal(got, paths) {
					t.Errorf("%s/%s: left %v, want all", k[0], k[1], got)
				}
			}
		})
	}
}
