// Package token is how an executor reached over a network knows that its
// caller is the control plane: the control plane signs a short-lived token
// with an ed25519 private key, the executor holds only the public key, so
// it can verify a token but never mint one, and neither can anything that
// reads the executor's environment (user code, a compromised sandbox).
//
// A token names the one sandbox it is for: an executor refuses a token for
// another id, so a pod IP reused by a new sandbox never takes a request
// meant for the old one, and a token seen by one sandbox opens no other.
//
// The token travels in a one-line preamble that the dialer writes before
// the connection carries HTTP (preamble.go); the executor's listener reads
// and checks it before its HTTP server sees the connection (listener.go).
// This package imports neither the executor nor the runtimes.
package token

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	"github.com/sbx-sandbox/sbx/errdefs"
)

// A token, version 1, is the unpadded base64url encoding of
//
//	version  1 byte, 1
//	issued   8 bytes, big-endian Unix seconds
//	expires  8 bytes, big-endian Unix seconds
//	idlen    1 byte, 1..MaxIDLen
//	id       idlen bytes, [A-Za-z0-9_-]
//	sig      64 bytes, ed25519 over signingContext || the bytes above
//
// One fixed layout, one key type and no algorithm field: there is nothing
// in a token that chooses how it is checked.
const (
	version    = 1
	headerLen  = 1 + 8 + 8 + 1
	MaxIDLen   = 64
	maxRawLen  = headerLen + MaxIDLen + ed25519.SignatureSize
	maxEncoded = (maxRawLen*8 + 5) / 6
)

// signingContext separates these signatures from anything else the same
// key might ever sign.
const signingContext = "sbx-executor-auth-v1\x00"

const (
	// DefaultTTL is how long a token the Signer issues is valid. A token
	// is checked only when a connection opens (later requests ride the
	// accepted connection), so it needs only outlive the dial.
	DefaultTTL = 60 * time.Second
	// DefaultSkew is the clock difference between the control plane and a
	// node that the Verifier tolerates, both ways.
	DefaultSkew = 30 * time.Second
	// MaxLifetime bounds expires - issued of a token the Verifier accepts,
	// whatever the signer asked for: a token that lives for days is a
	// mistake or a theft waiting to happen.
	MaxLifetime = 10 * time.Minute
)

// ValidID reports whether id may be named in a token: the sandbox ids of
// the runtimes (1 to 64 of [A-Za-z0-9_-]).
func ValidID(id string) bool {
	// The same alphabet as base64url's, by coincidence.
	return len(id) > 0 && len(id) <= MaxIDLen && base64URL(id)
}

// Claims is what a token says.
type Claims struct {
	SandboxID string
	IssuedAt  time.Time
	ExpiresAt time.Time
}

// Signer issues tokens. It holds the control plane's private key.
type Signer struct {
	key ed25519.PrivateKey
	// TTL is the validity of the tokens it issues. Default DefaultTTL; at
	// most MaxLifetime (a Verifier refuses longer ones).
	TTL time.Duration
	now func() time.Time
}

// NewSigner returns a Signer for key.
func NewSigner(key ed25519.PrivateKey) (*Signer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("token: private key of %d bytes, want %d: %w", len(key), ed25519.PrivateKeySize, errdefs.ErrInvalidArgument)
	}
	return &Signer{key: key, TTL: DefaultTTL, now: time.Now}, nil
}

// PublicKey is the key executors verify this Signer's tokens with.
func (s *Signer) PublicKey() ed25519.PublicKey {
	return s.key.Public().(ed25519.PublicKey)
}

// Sign issues a token for the executor of sandboxID, valid from now for TTL.
func (s *Signer) Sign(sandboxID string) (string, error) {
	if !ValidID(sandboxID) {
		return "", fmt.Errorf("token: sandbox id %q: %w", sandboxID, errdefs.ErrInvalidArgument)
	}
	ttl := s.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if ttl > MaxLifetime {
		return "", fmt.Errorf("token: ttl %s over %s: %w", ttl, MaxLifetime, errdefs.ErrInvalidArgument)
	}
	now := s.now()
	return s.sign(Claims{SandboxID: sandboxID, IssuedAt: now, ExpiresAt: now.Add(ttl)}), nil
}

// sign encodes c without checking it: tests use it to forge what a
// careless or hostile signer could produce.
func (s *Signer) sign(c Claims) string {
	raw := make([]byte, headerLen, maxRawLen)
	raw[0] = version
	binary.BigEndian.PutUint64(raw[1:9], uint64(c.IssuedAt.Unix()))
	binary.BigEndian.PutUint64(raw[9:17], uint64(c.ExpiresAt.Unix()))
	raw[17] = byte(len(c.SandboxID))
	raw = append(raw, c.SandboxID...)
	raw = append(raw, ed25519.Sign(s.key, signed(raw))...)
	return base64.RawURLEncoding.EncodeToString(raw)
}

func signed(body []byte) []byte {
	m := make([]byte, 0, len(signingContext)+len(body))
	return append(append(m, signingContext...), body...)
}

// Verifier checks tokens for one executor. It holds only a public key.
type Verifier struct {
	key       ed25519.PublicKey
	sandboxID string
	// Skew is the clock difference tolerated. Default DefaultSkew.
	Skew time.Duration
	now  func() time.Time
}

// NewVerifier returns a Verifier that accepts tokens signed with the
// private half of key and issued for sandboxID, the executor's own id.
func NewVerifier(key ed25519.PublicKey, sandboxID string) (*Verifier, error) {
	if len(key) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("token: public key of %d bytes, want %d: %w", len(key), ed25519.PublicKeySize, errdefs.ErrInvalidArgument)
	}
	if !ValidID(sandboxID) {
		return nil, fmt.Errorf("token: sandbox id %q: %w", sandboxID, errdefs.ErrInvalidArgument)
	}
	return &Verifier{key: key, sandboxID: sandboxID, Skew: DefaultSkew, now: time.Now}, nil
}

// SandboxID is the id this Verifier accepts tokens for.
func (v *Verifier) SandboxID() string { return v.sandboxID }

var (
	errMalformed = fmt.Errorf("token: malformed: %w", errdefs.ErrUnauthenticated)
	errSignature = fmt.Errorf("token: bad signature: %w", errdefs.ErrUnauthenticated)
)

// Verify checks tok and returns its claims. Every refusal wraps
// errdefs.ErrUnauthenticated. The signature is checked before any claim
// is believed.
func (v *Verifier) Verify(tok string) (Claims, error) {
	// The alphabet is checked first: Go's base64 decoders skip '\r' and
	// '\n' even in strict mode, and a token has one spelling only.
	if len(tok) > maxEncoded || !base64URL(tok) {
		return Claims{}, errMalformed
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(tok)
	if err != nil || len(raw) < headerLen+1+ed25519.SignatureSize {
		return Claims{}, errMalformed
	}
	n := int(raw[17])
	if raw[0] != version || n < 1 || n > MaxIDLen || len(raw) != headerLen+n+ed25519.SignatureSize {
		return Claims{}, errMalformed
	}
	body, sig := raw[:headerLen+n], raw[headerLen+n:]
	if !ed25519.Verify(v.key, signed(body), sig) {
		return Claims{}, errSignature
	}
	iat, exp := int64(binary.BigEndian.Uint64(raw[1:9])), int64(binary.BigEndian.Uint64(raw[9:17]))
	c := Claims{SandboxID: string(raw[headerLen : headerLen+n]), IssuedAt: time.Unix(iat, 0), ExpiresAt: time.Unix(exp, 0)}
	if !ValidID(c.SandboxID) {
		return Claims{}, errMalformed
	}
	if c.SandboxID != v.sandboxID {
		return Claims{}, fmt.Errorf("token: for sandbox %q, this is %q: %w", c.SandboxID, v.sandboxID, errdefs.ErrUnauthenticated)
	}
	if exp <= iat || exp-iat > int64(MaxLifetime/time.Second) {
		return Claims{}, fmt.Errorf("token: lifetime %ds out of 1..%d: %w", exp-iat, int64(MaxLifetime/time.Second), errdefs.ErrUnauthenticated)
	}
	now := v.now()
	if c.IssuedAt.After(now.Add(v.Skew)) {
		return Claims{}, fmt.Errorf("token: issued in the future (%s): %w", c.IssuedAt.UTC().Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	if !now.Before(c.ExpiresAt.Add(v.Skew)) {
		return Claims{}, fmt.Errorf("token: expired at %s: %w", c.ExpiresAt.UTC().Format(time.RFC3339), errdefs.ErrUnauthenticated)
	}
	return c, nil
}

func base64URL(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// GenerateKey makes a new key pair for the control plane.
func GenerateKey() (ed25519.PublicKey, ed25519.PrivateKey, error) {
	return ed25519.GenerateKey(rand.Reader)
}

// EncodePublicKey is the form of a public key in flags, environment
// variables and files: the 32 bytes in standard base64.
func EncodePublicKey(k ed25519.PublicKey) string { return base64.StdEncoding.EncodeToString(k) }

// EncodePrivateKey encodes the private key as its 32-byte seed in standard
// base64. It is a secret: keep it out of logs, argv and sandboxes.
func EncodePrivateKey(k ed25519.PrivateKey) string {
	return base64.StdEncoding.EncodeToString(k.Seed())
}

// ParsePublicKey reads EncodePublicKey's form; surrounding white space (a
// file's newline) is ignored.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := decodeKey(s, ed25519.PublicKeySize)
	if err != nil {
		return nil, fmt.Errorf("token: public key: %w", err)
	}
	return ed25519.PublicKey(b), nil
}

// ParsePrivateKey reads EncodePrivateKey's form.
func ParsePrivateKey(s string) (ed25519.PrivateKey, error) {
	b, err := decodeKey(s, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("token: private key: %w", err)
	}
	return ed25519.NewKeyFromSeed(b), nil
}

func decodeKey(s string, size int) ([]byte, error) {
	s = strings.TrimSpace(s)
	if len(s) > 2*base64.StdEncoding.EncodedLen(size) {
		return nil, fmt.Errorf("%d characters: %w", len(s), errdefs.ErrInvalidArgument)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	if len(b) != size {
		return nil, fmt.Errorf("%d bytes, want %d: %w", len(b), size, errdefs.ErrInvalidArgument)
	}
	return b, nil
}
