package store

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// The page size bounds of ListSessions and ListExecutions.
const (
	DefaultPageSize = 100
	MaxPageSize     = 1000
)

// PageSize checks a requested page size and applies the default to 0.
func PageSize(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultPageSize, nil
	case limit < 0 || limit > MaxPageSize:
		return 0, fmt.Errorf("limit %d: want 1..%d: %w", limit, MaxPageSize, errdefs.ErrInvalidArgument)
	}
	return limit, nil
}

// EncodePageToken makes the token of the page that follows the record
// created at t with id: lists are ordered by (CreatedAt, ID) descending, so
// that pair is the keyset position. Backends share it so that a token means
// the same to each.
func EncodePageToken(t time.Time, id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(t.UnixMicro(), 10) + ":" + id))
}

// DecodePageToken returns the position EncodePageToken encoded;
// errdefs.ErrInvalidArgument if tok is not a token.
func DecodePageToken(tok string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", fmt.Errorf("page token %q: %w", tok, errdefs.ErrInvalidArgument)
	}
	us, id, ok := strings.Cut(string(b), ":")
	n, err := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || id == "" {
		return time.Time{}, "", fmt.Errorf("page token %q: %w", tok, errdefs.ErrInvalidArgument)
	}
	return time.UnixMicro(n).UTC(), id, nil
}
