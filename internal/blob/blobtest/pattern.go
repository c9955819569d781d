package blobtest

import (
	"encoding/binary"
	"io"
)

// pattern is a blob's content made as it is read, never held: each
// 8-byte word is a mix of its index and the seed, so no two parts of a
// blob (nor two blobs) are alike and a part stored or served out of
// place shows. Its bytes at any offset are known without reading up to
// it (at).
type pattern struct {
	seed      uint64
	off, size int64
}

func newPattern(seed uint64, size int64) *pattern { return &pattern{seed: seed, size: size} }

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.size {
		return 0, io.EOF
	}
	if left := p.size - p.off; int64(len(b)) > left {
		b = b[:left]
	}
	p.at(p.off, b)
	p.off += int64(len(b))
	return len(b), nil
}

// at fills b with the pattern's bytes from off.
func (p *pattern) at(off int64, b []byte) {
	var w [8]byte
	for len(b) > 0 {
		word := mix(p.seed + uint64(off)/8*0x9e3779b97f4a7c15)
		if off%8 == 0 && len(b) >= 8 {
			binary.LittleEndian.PutUint64(b, word)
			b, off = b[8:], off+8
			continue
		}
		binary.LittleEndian.PutUint64(w[:], word)
		n := copy(b, w[off%8:])
		b, off = b[n:], off+int64(n)
	}
}

// mix is splitmix64's finaliser.
func mix(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
