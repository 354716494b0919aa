// Package namehash is SHA-256 (FIPS 180-4) for names derived from IDs:
// the host veth name of an attachment (datapath/podnet.VethNames) and a
// CNI delete-queue entry's file name. It exists for the CNI plugin,
// exec'd once per pod: crypto/sha256 brings the Go FIPS 140 module
// (DRBG, AES-GCM, SHA-3, SHA-512, HMAC) whose package initialisation
// cost the plugin ~1.5 ms of CPU per exec on the benchmark machine
// (BENCHMARKS.md), for hashing two short strings. The digests are
// crypto/sha256's (the tests compare them), so names do not change.
// Not for anything secret: this is a plain, not constant-time,
// implementation.
package namehash

import (
	"encoding/binary"
	"math/bits"
)

// Size is a digest's length in bytes.
const Size = 32

var k = [64]uint32{
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

// Sum256 is the SHA-256 digest of the concatenation of parts.
func Sum256(parts ...[]byte) [Size]byte {
	h := [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}
	var buf [64]byte
	n, total := 0, uint64(0)
	for _, p := range parts {
		total += uint64(len(p))
		for len(p) > 0 {
			c := copy(buf[n:], p)
			n += c
			p = p[c:]
			if n == len(buf) {
				block(&h, &buf)
				n = 0
			}
		}
	}
	// Padding: 0x80, zeros, the length in bits (big-endian) at the end
	// of a block.
	buf[n] = 0x80
	n++
	if n > 56 {
		clear(buf[n:])
		block(&h, &buf)
		n = 0
	}
	clear(buf[n:56])
	binary.BigEndian.PutUint64(buf[56:], total*8)
	block(&h, &buf)
	var out [Size]byte
	for i, v := range h {
		binary.BigEndian.PutUint32(out[4*i:], v)
	}
	return out
}

func block(h *[8]uint32, p *[64]byte) {
	var w [64]uint32
	for i := 0; i < 16; i++ {
		w[i] = binary.BigEndian.Uint32(p[4*i:])
	}
	for i := 16; i < 64; i++ {
		s0 := bits.RotateLeft32(w[i-15], -7) ^ bits.RotateLeft32(w[i-15], -18) ^ (w[i-15] >> 3)
		s1 := bits.RotateLeft32(w[i-2], -17) ^ bits.RotateLeft32(w[i-2], -19) ^ (w[i-2] >> 10)
		w[i] = w[i-16] + s0 + w[i-7] + s1
	}
	a, b, c, d, e, f, g, hh := h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]
	for i := 0; i < 64; i++ {
		t1 := hh + (bits.RotateLeft32(e, -6) ^ bits.RotateLeft32(e, -11) ^ bits.RotateLeft32(e, -25)) + ((e & f) ^ (^e & g)) + k[i] + w[i]
		t2 := (bits.RotateLeft32(a, -2) ^ bits.RotateLeft32(a, -13) ^ bits.RotateLeft32(a, -22)) + ((a & b) ^ (a & c) ^ (b & c))
		hh, g, f, e, d, c, b, a = g, f, e, d+t1, c, b, a, t1+t2
	}
	h[0] += a
	h[1] += b
	h[2] += c
	h[3] += d
	h[4] += e
	h[5] += f
	h[6] += g
	h[7] += hh
}
