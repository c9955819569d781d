package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
	"github.com/sbx-sandbox/sbx/internal/blob"
	blobfs "github.com/sbx-sandbox/sbx/internal/blob/fs"
	"github.com/sbx-sandbox/sbx/internal/blob/s3"
	"github.com/sbx-sandbox/sbx/internal/store"
	"github.com/sbx-sandbox/sbx/internal/store/postgres"
	"github.com/sbx-sandbox/sbx/internal/store/sqlite"
)

// Backends are chosen by URL:
//
//	--store  sqlite:///var/lib/sbx/sbx.db (the default, under DataDir)
//	         postgres://user:pass@host:port/db?sslmode=...
//	--blob   file:///var/lib/sbx/blobs (the default, under DataDir)
//	         s3://BUCKET/PREFIX?endpoint=http://127.0.0.1:9000&region=us-east-1
//	         (path-style for MinIO; AWS S3 without endpoint; credentials
//	         from the standard AWS environment and shared config files)
//
// A URL that names no backend, or a backend that cannot be reached, fails
// Open with one line that says which and why; a password in a URL is
// never repeated in it.

// openStore opens the metadata store raw names ("" is the default).
// openStore opens the store at raw; a PostgreSQL server that does not
// answer is waited for up to wait.
func openStore(ctx context.Context, raw, dataDir string, wait time.Duration) (store.Store, error) {
	if raw == "" {
		raw = "sqlite://" + filepath.Join(dataDir, "sbx.db")
	}
	scheme, rest, _ := strings.Cut(raw, "://")
	switch scheme {
	case "sqlite":
		path, err := localPath(raw, rest)
		if err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		st, err := sqlite.Open(ctx, path)
		if err != nil {
			return nil, fmt.Errorf("--store %s: %w", raw, err)
		}
		return st, nil
	case "postgres", "postgresql":
		// A server that starts with its database (a Deployment beside a
		// StatefulSet, a NetworkPolicy not yet programmed for a new Pod)
		// waits for it a while rather than exit and be restarted later.
		deadline := time.Now().Add(wait)
		for wait := 500 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
			st, err := postgres.Open(ctx, raw)
			if err == nil {
				return st, nil
			}
			if !errors.Is(err, errdefs.ErrUnavailable) || time.Now().Add(wait).After(deadline) {
				return nil, fmt.Errorf("--store postgres: %w", err)
			}
			slog.Warn("the store does not answer yet; waiting", "err", err, "retry_in", wait)
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("--store postgres: %w", err)
			case <-time.After(wait):
			}
		}
	}
	return nil, fmt.Errorf("--store %q: want sqlite:///PATH or postgres://USER:PASSWORD@HOST:PORT/DB: %w", redact(raw), errdefs.ErrInvalidArgument)
}

// openBlobs opens the blob store raw names ("" is the default).
func openBlobs(ctx context.Context, raw, dataDir string) (blob.Store, error) {
	if raw == "" {
		raw = "file://" + filepath.Join(dataDir, "blobs")
	}
	scheme, _, _ := strings.Cut(raw, "://")
	switch scheme {
	case "file":
		b, err := blobfs.Open(ctx, raw)
		if err != nil {
			return nil, fmt.Errorf("--blob: %w", err)
		}
		return b, nil
	case "s3":
		b, err := s3.Open(ctx, raw)
		if err != nil {
			return nil, fmt.Errorf("--blob: %w", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("--blob %q: want file:///PATH or s3://BUCKET/PREFIX?endpoint=...&region=...: %w", redact(raw), errdefs.ErrInvalidArgument)
}

// localPath is the absolute path of a sqlite:// or file:// URL.
func localPath(raw, rest string) (string, error) {
	if rest == "" || !strings.HasPrefix(rest, "/") || strings.ContainsAny(rest, "?#") {
		return "", fmt.Errorf("%q: want an absolute path after the scheme, as in %s:///var/lib/sbx/...: %w",
			raw, strings.SplitN(raw, ":", 2)[0], errdefs.ErrInvalidArgument)
	}
	return filepath.Clean(rest), nil
}

// redact is raw without the password it may hold.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		if strings.Contains(raw, "@") {
			return "(a URL that does not parse)"
		}
		return raw
	}
	return u.Redacted()
}

// pinger is a blob store that can say whether it answers.
type pinger interface{ Ping(context.Context) error }

// blobReady says whether the blob store answers, for /readyz (which asks
// the metadata store itself).
func blobReady(ctx context.Context, blobs blob.Store) error {
	if p, ok := blobs.(pinger); ok {
		return p.Ping(ctx)
	}
	if _, err := blobs.Stat(ctx, "readyz"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}
