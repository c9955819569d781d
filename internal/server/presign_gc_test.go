package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbx-sandbox/sbx/api"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
)

// Presigned copies are objects of the one content store: kept until an
// hour after the last URL made for them expires, a presign of the same
// content keeps them longer, and the one collector (snapshot.Store.Collect)
// frees them afterwards.
func TestPresignCollect(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := presignServer(t, blobs)
	file := filepath.Join(dir, "f.txt")
	os.WriteFile(file, []byte("live"), 0o644)
	live := presignFile(t, s, "t", file)
	ns := presignNamespace(s.opt.SigningKey, "t")
	sum := strings.Split(strings.SplitAfter(live, "/presigned/"+ns+"/")[1], "/")[0]
	o, err := s.opt.Objects.OpenObject(ctx, PresignNamespace(s.opt.SigningKey, "t"), sum)
	if err != nil {
		t.Fatal(err)
	}
	keep := o.KeepUntil()
	if want := time.Now().Add(defaultPresignExpiry*time.Second + presignGrace); keep.Before(want.Add(-time.Minute)) || keep.After(want.Add(time.Minute)) {
		t.Errorf("kept until %v, want about %v", keep, want)
	}
	// A presign of the same content for longer keeps the copy longer.
	longer := presignFileFor(t, s, "t", file, maxPresignExpiry)
	if o, err := s.opt.Objects.OpenObject(ctx, PresignNamespace(s.opt.SigningKey, "t"), sum); err != nil || !o.KeepUntil().After(keep.Add(time.Hour)) {
		t.Fatalf("after a longer presign: %v %v", o.KeepUntil(), err)
	}

	// A copy past its time, as the collector finds it.
	expired, err := s.opt.Objects.PutObject(ctx, PresignNamespace(s.opt.SigningKey, "t"), "", strings.NewReader("expired"), 100, time.Now().Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Unix()
	old := api.Prefix + "/presigned/" + ns + "/" + expired.SHA256 + "/e.txt?expires=" + strconv.FormatInt(exp, 10) + "&signature=" + s.sign(ns, expired.SHA256, "e.txt", exp)
	if code, _ := fetch(t, s, old); code != http.StatusNotFound {
		t.Errorf("a copy past its time: %d", code)
	}
	c, err := s.opt.Objects.Collect(ctx, 0)
	if err != nil || c.Objects != 1 || c.Chunks != 1 {
		t.Fatalf("collect: %+v %v; want the expired copy and its chunk", c, err)
	}
	for _, u := range []string{live, longer} {
		if code, body := fetch(t, s, u); code != 200 || string(body) != "live" {
			t.Errorf("a live copy after collection: %d %q", code, body)
		}
	}
}

// A copy the server before objects made (a whole blob under presigned/)
// still serves its URLs, ranges too; one that is not there is a 404.
func TestPresignedBefore(t *testing.T) {
	dir := t.TempDir()
	blobs, err := blobfs.New(filepath.Join(dir, "blobs"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s := presignServer(t, blobs)
	ns := presignNamespace(s.opt.SigningKey, "t")
	content := "made before objects"
	sum := fmt.Sprintf("%x", sha256.Sum256([]byte(content)))
	if _, err := blobs.Put(ctx, "presigned/"+ns+"/"+sum, strings.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Unix()
	url := func(sum string) string {
		return api.Prefix + "/presigned/" + ns + "/" + sum + "/old.txt?expires=" + strconv.FormatInt(exp, 10) + "&signature=" + s.sign(ns, sum, "old.txt", exp)
	}
	if code, body := fetch(t, s, url(sum)); code != http.StatusOK || string(body) != content {
		t.Fatalf("a copy made before objects: %d %q", code, body)
	}
	if code, body := fetch(t, s, url(sum), "Range", "bytes=5-10"); code != http.StatusPartialContent || string(body) != content[5:11] {
		t.Errorf("a range of it: %d %q", code, body)
	}
	gone := strings.Repeat("ab", 32)
	if code, _ := fetch(t, s, url(gone)); code != http.StatusNotFound {
		t.Errorf("a copy that is in neither place: %d", code)
	}
}
