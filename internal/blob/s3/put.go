package s3

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// Put implements blob.Store. A blob that fits in one part is one
// PutObject; a larger one a multipart upload. Either way S3 shows the new
// object only once it is whole, and a failed Put leaves the old one.
func (s *Store) Put(ctx context.Context, key string, r io.Reader) (int64, error) {
	obj, err := s.object(key)
	if err != nil {
		return 0, err
	}
	buf := s.buf()
	n, err := io.ReadFull(ctxReader{ctx, r}, *buf)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		defer s.bufs.Put(buf)
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:        &s.bucket,
			Key:           &obj,
			Body:          bytes.NewReader((*buf)[:n]),
			ContentLength: aws.Int64(int64(n)),
		})
		if err != nil {
			return 0, s.fail(key, err)
		}
		return int64(n), nil
	case err != nil:
		s.bufs.Put(buf)
		return 0, fmt.Errorf("blob %s: %w", key, err)
	}
	return s.putParts(ctx, key, obj, buf, r)
}

func (s *Store) buf() *[]byte { return s.bufs.Get().(*[]byte) }

// putParts stores r, whose first PartSize bytes are in first, by a
// multipart upload of Concurrency parts at a time. A part is read while
// the others upload, so at most Concurrency+1 buffers are in use.
func (s *Store) putParts(ctx context.Context, key, obj string, first *[]byte, r io.Reader) (int64, error) {
	create := &s3.CreateMultipartUploadInput{Bucket: &s.bucket, Key: &obj}
	if s.crc32 {
		create.ChecksumAlgorithm = types.ChecksumAlgorithmCrc32
	}
	up, err := s.client.CreateMultipartUpload(ctx, create)
	if err != nil {
		s.bufs.Put(first)
		return 0, s.fail(key, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		parts []types.CompletedPart
		perr  error // the first part that failed
		wg    sync.WaitGroup
		slots = make(chan struct{}, Concurrency)
		// free keeps this upload's buffers for its next parts: put back
		// in the pool, they would be garbage at the next GC, and the heap
		// would grow with the garbage of a long upload.
		free = make(chan *[]byte, Concurrency+1)
	)
	get := func() *[]byte {
		select {
		case b := <-free:
			return b
		default:
			return s.buf()
		}
	}
	release := func(b *[]byte) {
		select {
		case free <- b:
		default:
			s.bufs.Put(b)
		}
	}
	defer func() {
		for range len(free) {
			s.bufs.Put(<-free)
		}
	}()
	failed := func(err error) {
		mu.Lock()
		if perr == nil {
			perr = err
		}
		mu.Unlock()
		cancel()
	}
	upload := func(num int32, buf *[]byte, n int) {
		defer func() { release(buf); <-slots; wg.Done() }()
		in := &s3.UploadPartInput{
			Bucket:        &s.bucket,
			Key:           &obj,
			UploadId:      up.UploadId,
			PartNumber:    aws.Int32(num),
			Body:          bytes.NewReader((*buf)[:n]),
			ContentLength: aws.Int64(int64(n)),
		}
		if s.crc32 {
			in.ChecksumAlgorithm = types.ChecksumAlgorithmCrc32
		}
		out, err := s.client.UploadPart(ctx, in)
		if err != nil {
			failed(s.fail(key, err))
			return
		}
		mu.Lock()
		parts = append(parts, types.CompletedPart{PartNumber: aws.Int32(num), ETag: out.ETag, ChecksumCRC32: out.ChecksumCRC32})
		mu.Unlock()
	}

	var size int64
	buf, n := first, len(*first)
	for num := int32(1); ; num++ {
		if num > MaxParts {
			release(buf)
			err = fmt.Errorf("blob %s: over %d GiB, the most an upload of %d parts of %d MiB holds: %w",
				key, MaxParts*PartSize>>30, MaxParts, PartSize>>20, errdefs.ErrTooLarge)
			break
		}
		slots <- struct{}{}
		wg.Add(1)
		go upload(num, buf, n)
		size += int64(n)
		if n < PartSize {
			break // that was the last
		}
		buf = get()
		n, err = io.ReadFull(ctxReader{ctx, r}, *buf)
		if err == io.EOF {
			release(buf)
			err = nil
			break
		}
		if err == io.ErrUnexpectedEOF {
			err = nil // the last part, shorter
		}
		if err != nil {
			release(buf)
			err = fmt.Errorf("blob %s: %w", key, err)
			break
		}
	}
	wg.Wait()
	if perr != nil {
		err = perr // the cause; the read may have stopped on its cancel
	}
	if err == nil {
		slices.SortFunc(parts, func(a, b types.CompletedPart) int { return int(*a.PartNumber - *b.PartNumber) })
		_, err = s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket:          &s.bucket,
			Key:             &obj,
			UploadId:        up.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
		})
		if err == nil {
			return size, nil
		}
		err = s.fail(key, err)
	}
	// The parts stored so far are billed until the upload is aborted, even
	// when the Put was cancelled.
	actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer acancel()
	if _, aerr := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &s.bucket, Key: &obj, UploadId: up.UploadId}); aerr != nil {
		err = fmt.Errorf("%w (and aborting its upload: %v)", err, oneLine(aerr))
	}
	return 0, err
}

// ctxReader stops a long read when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
