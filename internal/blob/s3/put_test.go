package s3

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sbx-sandbox/sbx/internal/testenv/miniotest"
)

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

type failing struct{ err error }

func (f failing) Read([]byte) (int, error) { return 0, f.err }

// cancelling cancels its context once read past half of its reader.
type cancelling struct {
	r      io.Reader
	n      int64
	cancel context.CancelFunc
}

func (c *cancelling) Read(p []byte) (int, error) {
	if c.n > PartSize*3/2 {
		c.cancel()
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// A multipart Put that fails, on its reader's error or its context's
// end, keeps the old blob and leaves no upload behind.
func TestFailedMultipartPut(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, miniotest.New(t).URL)
	if err != nil {
		t.Fatal(err)
	}
	s.Put(ctx, "k", strings.NewReader("old"))
	broken := errors.New("broken")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, c := range []struct {
		name string
		ctx  context.Context
		r    io.Reader
		is   error
	}{
		{"reader", ctx, io.MultiReader(io.LimitReader(zeros{}, 3*PartSize+5), failing{broken}), broken},
		{"context", cctx, &cancelling{r: io.LimitReader(zeros{}, 3*PartSize), cancel: cancel}, context.Canceled},
	} {
		if _, err := s.Put(c.ctx, "k", c.r); !errors.Is(err, c.is) {
			t.Errorf("%s: Put = %v, want %v", c.name, err, c.is)
		}
		r, err := s.Open(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(r); string(b) != "old" {
			t.Errorf("%s: after a failed Put the blob is %d bytes", c.name, len(b))
		}
		r.Close()
		ups, err := s.client.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &s.bucket})
		if err != nil || len(ups.Uploads) != 0 {
			t.Errorf("%s: uploads left: %d, %v", c.name, len(ups.Uploads), err)
		}
	}
}
