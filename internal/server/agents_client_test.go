package server_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sbx-sandbox/sbx/client"
	"github.com/sbx-sandbox/sbx/errdefs"
)

// The Go client's agent file calls against a real server.
func TestAgentFileClient(t *testing.T) {
	ts := start(t)
	c := ts.client("")
	ctx := context.Background()
	if _, err := c.AgentListFiles(ctx, "reader", "carol", client.ListFilesOptions{}); !client.IsNotFound(err) {
		t.Fatalf("list before any upload: %v", err)
	}
	up, err := c.AgentUpload(ctx, "reader", "carol", client.UploadOptions{ConversationID: "c2"},
		client.UploadFile{Name: "doc.txt", Reader: strings.NewReader("page one|page two")})
	if err != nil || len(up.Files) != 1 {
		t.Fatalf("upload: %+v %v", up, err)
	}
	list, err := c.AgentListFiles(ctx, "reader", "carol", client.ListFilesOptions{ConversationID: "c2"})
	if err != nil || len(list.Files) != 1 || list.Files[0].Name != "doc.txt" {
		t.Fatalf("list: %+v %v", list, err)
	}
	for _, tc := range []struct {
		offset, length int64
		want           string
	}{{0, 8, "page one"}, {9, 0, "page two"}} {
		rc, err := c.AgentOpenFile(ctx, "reader", "carol", "c2", "doc.txt", tc.offset, tc.length)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != tc.want {
			t.Errorf("part at %d: %q, want %q", tc.offset, b, tc.want)
		}
	}
	// Another user's session has none of it.
	if _, err := c.AgentOpenFile(ctx, "reader", "dave", "c2", "doc.txt", 0, 0); !client.IsNotFound(err) {
		t.Errorf("another user: %v", err)
	}
	if _, err := c.AgentUpload(ctx, "reader", "", client.UploadOptions{}, client.UploadFile{Name: "x", Reader: strings.NewReader("x")}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("no user: %v", err)
	}
	if _, err := c.AgentUpload(ctx, "reader", "../x", client.UploadOptions{}, client.UploadFile{Name: "x", Reader: strings.NewReader("x")}); err == nil {
		t.Error("a user id with a path in it was taken")
	}
}
