package s3

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// skipMax is how far forward a Seek may go and still be read through
// on the open GET rather than with a new one: a new request costs about
// what reading this much does.
const skipMax = 256 << 10

// readRetries is how many times a read that fails in the middle of a
// GET's body (a connection reset) is taken up again with a ranged GET.
const readRetries = 2

// Open implements blob.Store. It starts a GET of the whole blob, which a
// reader from the start reads through; a Seek elsewhere is served by a
// ranged GET from there, pinned to the ETag of the first, so a reader
// sees one version of the blob or an error (errdefs.ErrUnavailable),
// never a mix. The reader's requests are made under ctx.
func (s *Store) Open(ctx context.Context, key string) (blob.Reader, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, err
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &s.bucket, Key: &obj})
	if err != nil {
		return nil, s.fail(key, err)
	}
	return &reader{
		s:    s,
		ctx:  ctx,
		obj:  obj,
		info: blob.Info{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)},
		etag: aws.ToString(out.ETag),
		body: out.Body,
	}, nil
}

// reader is an open blob. pos is where the next Read reads; body, if
// not nil, is an open GET's, at bodyPos.
type reader struct {
	s       *Store
	ctx     context.Context
	obj     string
	info    blob.Info
	etag    string
	pos     int64
	body    io.ReadCloser
	bodyPos int64
}

func (r *reader) Info() blob.Info { return r.info }

func (r *reader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += r.pos
	case io.SeekEnd:
		offset += r.info.Size
	default:
		return r.pos, fmt.Errorf("blob %s: seek whence %d: %w", r.info.Key, whence, errdefs.ErrInvalidArgument)
	}
	if offset < 0 {
		return r.pos, fmt.Errorf("blob %s: seek to %d: %w", r.info.Key, offset, errdefs.ErrInvalidArgument)
	}
	r.pos = offset
	return offset, nil
}

func (r *reader) Read(p []byte) (int, error) {
	if r.pos >= r.info.Size {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	if r.body != nil && r.bodyPos != r.pos {
		if d := r.pos - r.bodyPos; d > 0 && d <= skipMax {
			k, _ := io.CopyN(io.Discard, r.body, d)
			r.bodyPos += k
		}
		if r.bodyPos != r.pos {
			r.drop()
		}
	}
	if left := r.info.Size - r.pos; int64(len(p)) > left {
		p = p[:left]
	}
	for try := 0; ; try++ {
		if r.body == nil {
			if err := r.get(); err != nil {
				return 0, err
			}
		}
		n, err := r.body.Read(p)
		r.pos += int64(n)
		r.bodyPos += int64(n)
		switch {
		case err == nil:
			return n, nil
		case err == io.EOF && r.pos == r.info.Size:
			r.drop()
			return n, nil // the next Read says EOF
		case err == io.EOF:
			err = io.ErrUnexpectedEOF // shorter than it said
		}
		r.drop()
		if n > 0 {
			return n, nil // the next Read takes it up again
		}
		if try == readRetries || r.ctx.Err() != nil {
			return 0, fmt.Errorf("blob %s: %w", r.info.Key, err)
		}
	}
}

// get starts a ranged GET from pos, of the version Open found.
func (r *reader) get() error {
	out, err := r.s.client.GetObject(r.ctx, &s3.GetObjectInput{
		Bucket:  &r.s.bucket,
		Key:     &r.obj,
		Range:   aws.String(fmt.Sprintf("bytes=%d-", r.pos)),
		IfMatch: aws.String(r.etag),
	})
	if err != nil {
		err = r.s.fail(r.info.Key, err)
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("blob %s: deleted while it was read: %w", r.info.Key, errdefs.ErrNotFound)
		}
		return err
	}
	r.body, r.bodyPos = out.Body, r.pos
	return nil
}

// drop closes the open GET, if any.
func (r *reader) drop() {
	if r.body != nil {
		r.body.Close()
		r.body = nil
	}
}

func (r *reader) Close() error {
	r.drop()
	return nil
}
