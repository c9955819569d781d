package token

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sbx-sandbox/sbx/errdefs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the tests' "now": a fixed clock, so that expiry is a claim checked
// against a chosen time and never a race with the real one.
var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func newPair(t testing.TB, id string) (*Signer, *Verifier) {
	t.Helper()
	pub, priv, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	v, err := NewVerifier(pub, id)
	if err != nil {
		t.Fatal(err)
	}
	s.now = func() time.Time { return t0 }
	v.now = func() time.Time { return t0 }
	return s, v
}

func TestSignVerify(t *testing.T) {
	s, v := newPair(t, "sb-1")
	tok, err := s.Sign("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.Verify(tok)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if c.SandboxID != "sb-1" || !c.IssuedAt.Equal(t0) || !c.ExpiresAt.Equal(t0.Add(DefaultTTL)) {
		t.Fatalf("claims %+v", c)
	}
	if len(tok) > maxEncoded {
		t.Fatalf("token of %d characters, bound %d", len(tok), maxEncoded)
	}
	long := strings.Repeat("x", MaxIDLen)
	s2, v2 := newPair(t, long)
	tok, err = s2.Sign(long)
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) != maxEncoded || len(preamblePrefix)+len(tok)+1 > MaxPreamble {
		t.Fatalf("longest token %d characters, maxEncoded %d", len(tok), maxEncoded)
	}
	if _, err := v2.Verify(tok); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyRefuses is the attacks on a token: each must be refused with
// ErrUnauthenticated.
func TestVerifyRefuses(t *testing.T) {
	s, v := newPair(t, "sb-1")
	other, _ := newPair(t, "sb-1")
	good, err := s.Sign("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.RawURLEncoding.DecodeString(good)
	reencode := func(f func(b []byte) []byte) string {
		return base64.RawURLEncoding.EncodeToString(f(append([]byte(nil), raw...)))
	}
	claims := func(id string, iat, exp time.Time) string {
		return s.sign(Claims{SandboxID: id, IssuedAt: iat, ExpiresAt: exp})
	}
	mustSign := func(s *Signer, id string) string {
		tok, err := s.Sign(id)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	cases := []struct{ name, tok string }{
		{"empty", ""},
		{"garbage", "hello world"},
		{"garbage base64", base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("A", 150)))},
		{"wrong key", mustSign(other, "sb-1")},
		{"another sandbox", mustSign(s, "sb-2")},
		{"id prefix", mustSign(s, "sb-10")},
		{"expired", claims("sb-1", t0.Add(-2*time.Minute), t0.Add(-DefaultSkew-time.Second))},
		{"expired exactly at skew", claims("sb-1", t0.Add(-2*time.Minute), t0.Add(-DefaultSkew))},
		{"future beyond skew", claims("sb-1", t0.Add(DefaultSkew+time.Second), t0.Add(DefaultSkew+time.Minute))},
		{"lifetime over the maximum", claims("sb-1", t0, t0.Add(MaxLifetime+time.Second))},
		{"lifetime of days", claims("sb-1", t0.Add(-time.Hour), t0.Add(48*time.Hour))},
		{"expires before issued", claims("sb-1", t0, t0.Add(-time.Second))},
		{"zero lifetime", claims("sb-1", t0, t0)},
		{"bad id characters signed", claims("sb/1", t0, t0.Add(time.Minute))},
		{"truncated by one", good[:len(good)-1]},
		{"truncated to half", good[:len(good)/2]},
		{"signature cut", reencode(func(b []byte) []byte { return b[:len(b)-1] })},
		{"trailing byte", reencode(func(b []byte) []byte { return append(b, 0) })},
		{"padded", good + "=="},
		{"standard alphabet", strings.NewReplacer("-", "+", "_", "/").Replace(good) + "+"},
		{"version 2", reencode(func(b []byte) []byte { b[0] = 2; return b })},
		{"id length 0", reencode(func(b []byte) []byte { b[17] = 0; return b })},
		{"id length 200", reencode(func(b []byte) []byte { b[17] = 200; return b })},
		{"later expiry", reencode(func(b []byte) []byte { b[16]++; return b })},
		{"id swapped", reencode(func(b []byte) []byte { b[headerLen+3] = '2'; return b })},
		{"over long", strings.Repeat("A", 4096)},
		{"white space", good + " "},
		{"carriage return inside", good[:10] + "\r" + good[10:]},
		{"newline inside", good[:10] + "\n" + good[10:]},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if c, err := v.Verify(tc.tok); !errors.Is(err, errdefs.ErrUnauthenticated) {
				t.Fatalf("Verify = %+v, %v; want ErrUnauthenticated", c, err)
			}
		})
	}
	// Any one flipped bit anywhere in a good token is refused.
	for i := range raw {
		for bit := range 8 {
			tok := reencode(func(b []byte) []byte { b[i] ^= 1 << bit; return b })
			if _, err := v.Verify(tok); err == nil {
				t.Fatalf("byte %d bit %d flipped: accepted", i, bit)
			}
		}
	}
}

func TestVerifyClockSkew(t *testing.T) {
	s, v := newPair(t, "sb-1")
	for _, tc := range []struct {
		name     string
		iat, exp time.Time
	}{
		{"issued a little in the future", t0.Add(DefaultSkew - time.Second), t0.Add(DefaultSkew + time.Minute)},
		{"expired a little ago", t0.Add(-time.Minute), t0.Add(-DefaultSkew + time.Second)},
		{"maximum lifetime", t0.Add(-time.Minute), t0.Add(MaxLifetime - time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := v.Verify(s.sign(Claims{SandboxID: "sb-1", IssuedAt: tc.iat, ExpiresAt: tc.exp})); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestSignerRefuses(t *testing.T) {
	s, _ := newPair(t, "sb-1")
	for _, id := range []string{"", "a/b", "a b", "a\n", strings.Repeat("a", MaxIDLen+1), "é"} {
		if _, err := s.Sign(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Sign(%q) = %v", id, err)
		}
	}
	s.TTL = MaxLifetime + time.Second
	if _, err := s.Sign("sb-1"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Sign with a TTL over MaxLifetime = %v", err)
	}
	if _, err := NewSigner(make([]byte, 10)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NewSigner(short key) = %v", err)
	}
	if _, err := NewVerifier(make([]byte, 10), "sb-1"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NewVerifier(short key) = %v", err)
	}
	if _, err := NewVerifier(make([]byte, ed25519.PublicKeySize), "../x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NewVerifier(bad id) = %v", err)
	}
}

func TestKeyEncoding(t *testing.T) {
	pub, priv, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParsePublicKey(" " + EncodePublicKey(pub) + "\n")
	if err != nil || !p.Equal(pub) {
		t.Fatalf("ParsePublicKey = %v, %v", p, err)
	}
	k, err := ParsePrivateKey(EncodePrivateKey(priv) + "\n")
	if err != nil || !k.Equal(priv) {
		t.Fatalf("ParsePrivateKey = %v", err)
	}
	s, _ := NewSigner(k)
	if !s.PublicKey().Equal(pub) {
		t.Fatal("the signer's public key is not the pair's")
	}
	for _, bad := range []string{"", "!!!", EncodePublicKey(pub)[:20], EncodePublicKey(append(pub, 0)), strings.Repeat("A", 1<<20)} {
		if _, err := ParsePublicKey(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParsePublicKey(%.40q) = %v", bad, err)
		}
	}
	if _, err := ParsePrivateKey(base64.StdEncoding.EncodeToString(priv)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ParsePrivateKey(64 bytes) = %v", err)
	}
}

func FuzzVerify(f *testing.F) {
	s, v := newPair(f, "sb-1")
	good, _ := s.Sign("sb-1")
	f.Add(good)
	f.Add("")
	f.Add(good[:40])
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := v.Verify(tok)
		if err == nil && (tok != good || c.SandboxID != "sb-1") {
			t.Fatalf("accepted %q as %+v", tok, c)
		}
	})
}
