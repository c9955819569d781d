// Package s3 is the blob store on an S3 bucket (AWS S3, MinIO, any S3
// API), for servers that share their blobs. Each blob is one object under
// the store's prefix. Put streams: small blobs go in one PutObject, large
// ones in a multipart upload of bounded parts, so memory does not grow
// with a blob's size; either way S3 makes the new object visible whole or
// not at all. A Reader reads one version of its blob, by ranged GETs
// pinned to its ETag, so a Seek downloads nothing it skips.
//
// The store does not implement blob.Mover: S3 has no rename, and a copy
// and a delete are neither atomic nor cheap.
package s3

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
)

// The parts of a multipart upload: PartSize bytes each, Concurrency of
// them in flight, so a Put holds at most (Concurrency+1)*PartSize bytes
// (80 MiB). S3 takes at most MaxParts parts, which makes the largest blob
// MaxParts*PartSize (156 GiB).
const (
	PartSize    = 16 << 20
	Concurrency = 4
	MaxParts    = 10_000
)

// Store keeps blobs in a bucket under a prefix.
type Store struct {
	client *s3.Client
	bucket string
	prefix string // "" or ending in "/"
	where  string // the bucket and its endpoint, for errors
	// crc32 is whether parts carry CRC32 checksums (the SDK's default,
	// AWS_REQUEST_CHECKSUM_CALCULATION=when_supported): a multipart upload
	// must then be created with the algorithm and completed with the
	// parts' sums.
	crc32 bool
	bufs  sync.Pool // of *[]byte, PartSize long
}

var _ blob.Store = (*Store)(nil)

// Open returns the store at rawURL, s3://BUCKET/PREFIX with optional
// query parameters endpoint (an S3 API other than AWS's, such as MinIO's
// http://127.0.0.1:9000, addressed path-style) and region (default the
// standard chain's, AWS_REGION or the shared config; us-east-1 when an
// endpoint is given). Credentials come from the standard chain:
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN, the
// shared config and credentials files, then the platform's role. Open
// checks the bucket answers (Ping) and fails with one line saying what
// is wrong: the URL, the endpoint, the credentials or the bucket.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	loc, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var opts []func(*config.LoadOptions) error
	if loc.region != "" {
		opts = append(opts, config.WithRegion(loc.region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("blob store %s: the AWS configuration: %v: %w", loc, err, errdefs.ErrInvalidArgument)
	}
	// The chain is tried here, not at the first request, so that a machine
	// without credentials is told so rather than that S3 is unavailable.
	if cfg.Credentials == nil {
		return nil, fmt.Errorf("blob store %s: no AWS credentials provider: %w", loc, errdefs.ErrFailedPrecondition)
	}
	if _, err := cfg.Credentials.Retrieve(ctx); err != nil {
		return nil, fmt.Errorf("blob store %s: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or give the machine a role): %v: %w",
			loc, oneLine(err), errdefs.ErrFailedPrecondition)
	}
	if cfg.Region == "" {
		if loc.endpoint == "" {
			return nil, fmt.Errorf("blob store %s: no region: add ?region= or set AWS_REGION: %w", loc, errdefs.ErrInvalidArgument)
		}
		cfg.Region = "us-east-1"
	}
	s := &Store{
		bucket: loc.bucket,
		prefix: loc.prefix,
		where:  fmt.Sprintf("s3 bucket %q at %s", loc.bucket, loc.endpoint),
		crc32:  cfg.RequestChecksumCalculation != aws.RequestChecksumCalculationWhenRequired,
	}
	if loc.endpoint == "" {
		s.where = fmt.Sprintf("s3 bucket %q (AWS, %s)", loc.bucket, cfg.Region)
	}
	s.client = s3.NewFromConfig(cfg, func(o *s3.Options) {
		if loc.endpoint != "" {
			o.BaseEndpoint = aws.String(loc.endpoint)
			o.UsePathStyle = true // MinIO and most others: no bucket DNS names
		}
		// The SDK would warn on stderr at every read of a multipart blob
		// that it cannot check its composite checksum.
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	s.bufs.New = func() any { b := make([]byte, PartSize); return &b }
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// location is a parsed store URL.
type location struct {
	bucket, prefix, endpoint, region string
}

func (l location) String() string {
	return "s3://" + l.bucket + "/" + l.prefix
}

// bucketName is what S3 takes as a bucket's name (the rules for new
// buckets; older ones may differ, but not in what a URL can carry).
var bucketName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)

func parseURL(rawURL string) (location, error) {
	bad := func(format string, args ...any) (location, error) {
		return location{}, fmt.Errorf("blob store URL %q: %s (want s3://BUCKET/PREFIX?endpoint=URL&region=NAME): %w",
			redact(rawURL), fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return bad("%v", errors.Unwrap(err))
	}
	var loc location
	switch {
	case u.Scheme != "s3":
		return bad("the scheme is not s3")
	case u.User != nil:
		return bad("credentials do not go in the URL: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	case u.Opaque != "" || u.Fragment != "":
		return bad("not a URL of the form s3://BUCKET/PREFIX")
	case !bucketName.MatchString(u.Host):
		return bad("%q is not a bucket name", u.Host)
	}
	loc.bucket = u.Host
	if p := strings.Trim(u.Path, "/"); p != "" {
		if !blob.ValidKey(p) {
			return bad("the prefix %q is not a blob key", p)
		}
		loc.prefix = p + "/"
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return bad("the query: %v", err)
	}
	for k, v := range q {
		if len(v) != 1 {
			return bad("%s given %d times", k, len(v))
		}
		switch k {
		case "endpoint":
			e, err := url.Parse(v[0])
			if err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" || e.User != nil || e.RawQuery != "" || e.Fragment != "" {
				return bad("the endpoint %q is not an http:// or https:// URL", v[0])
			}
			loc.endpoint = strings.TrimSuffix(v[0], "/")
		case "region":
			loc.region = v[0]
		default:
			return bad("unknown parameter %q", k)
		}
	}
	return loc, nil
}

// redact hides a password a URL carries by mistake, even in a URL that
// does not parse.
func redact(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return u.Redacted()
	}
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return rawURL
	}
	authority, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(authority, '@'); i >= 0 {
		return rawURL[:len(rawURL)-len(rest)] + "xxxxx" + rest[i:]
	}
	return rawURL
}

// Ping checks that the bucket answers to the store's credentials: for
// readiness, and at Open.
func (s *Store) Ping(ctx context.Context) error {
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.bucket})
	if err == nil {
		return nil
	}
	var op *net.OpError
	switch status := httpStatus(err); {
	case errors.As(err, &op):
		return fmt.Errorf("%s: %v: %w", s.where, op, errdefs.ErrUnavailable)
	case status == http.StatusNotFound:
		return fmt.Errorf("%s: no such bucket: %w", s.where, errdefs.ErrNotFound)
	case status == http.StatusForbidden || status == http.StatusUnauthorized || status == http.StatusBadRequest:
		// A HEAD's answer has no body to say why; a listing's has.
		why := http.StatusText(status)
		_, lerr := s.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &s.bucket, MaxKeys: aws.Int32(1)})
		var api smithy.APIError
		if errors.As(lerr, &api) {
			why = api.ErrorCode() + ": " + api.ErrorMessage()
		}
		return fmt.Errorf("%s: access denied (%s); check the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and their rights on the bucket: %w",
			s.where, why, errdefs.ErrFailedPrecondition)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", s.where, ctx.Err())
	default:
		return fmt.Errorf("%s: %v: %w", s.where, oneLine(err), errdefs.ErrUnavailable)
	}
}

// oneLine is an error's text on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// httpStatus is the status of the S3 response err is of; 0 if none.
func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// fail wraps an S3 error about key in the category of errdefs it is of.
func (s *Store) fail(key string, err error) error {
	var nsb *types.NoSuchBucket
	switch status := httpStatus(err); {
	case errors.As(err, &nsb):
		return fmt.Errorf("blob %s: %s: no such bucket: %w", key, s.where, errdefs.ErrUnavailable)
	case status == http.StatusNotFound:
		return fmt.Errorf("blob %s: %w", key, errdefs.ErrNotFound)
	case status == http.StatusPreconditionFailed, status == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("blob %s: replaced while it was read: %w", key, errdefs.ErrUnavailable)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("blob %s: %w", key, err)
	case status >= 500, status == 0:
		return fmt.Errorf("blob %s: %s: %v: %w", key, s.where, oneLine(err), errdefs.ErrUnavailable)
	default:
		return fmt.Errorf("blob %s: %s: %w", key, s.where, err)
	}
}

// object is the object name of key.
func (s *Store) object(key string) (string, error) {
	if !blob.ValidKey(key) {
		return "", fmt.Errorf("blob key %q: %w", key, errdefs.ErrInvalidArgument)
	}
	return s.prefix + key, nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return blob.Info{}, err
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &obj})
	if err != nil {
		return blob.Info{}, s.fail(key, err)
	}
	return blob.Info{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)}, nil
}

// Delete implements blob.Store. S3 answers a delete of an absent object
// as one of a present one.
func (s *Store) Delete(ctx context.Context, key string) error {
	obj, err := s.object(key)
	if err != nil {
		return err
	}
	if _, err := s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &s.bucket, Key: &obj}); err != nil {
		if errors.Is(s.fail(key, err), errdefs.ErrNotFound) {
			return nil
		}
		return s.fail(key, err)
	}
	return nil
}

// List implements blob.Store: ListObjectsV2, a page (1,000 keys) at a
// time, in S3's order, which is the keys' byte-wise order.
func (s *Store) List(ctx context.Context, prefix string, fn func(blob.Info) error) error {
	if !blob.ValidPrefix(prefix) {
		return nil // and S3 may refuse it
	}
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: &s.bucket,
		Prefix: aws.String(s.prefix + prefix),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return s.fail(prefix+"*", err)
		}
		for _, o := range page.Contents {
			key := strings.TrimPrefix(aws.ToString(o.Key), s.prefix)
			if !blob.ValidKey(key) {
				continue // not put by a Store
			}
			if err := fn(blob.Info{Key: key, Size: aws.ToInt64(o.Size), ModTime: aws.ToTime(o.LastModified)}); err != nil {
				return err
			}
		}
	}
	return nil
}

// abortTimeout bounds the abort of a failed multipart upload, which runs
// even when the Put's context is done.
const abortTimeout = time.Minute
