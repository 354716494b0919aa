package namehash

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// TestKnownDigests checks FIPS 180-4's examples.
func TestKnownDigests(t *testing.T) {
	for in, want := range map[string]string{
		"":    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		"abc": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
		"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq": "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
	} {
		if got := Sum256([]byte(in)); hex.EncodeToString(got[:]) != want {
			t.Errorf("Sum256(%q) = %x, want %s", in, got, want)
		}
	}
}

// TestMatchesCryptoSHA256 compares against crypto/sha256 at every length
// around the block and padding boundaries, split into parts anywhere.
func TestMatchesCryptoSHA256(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 300; n++ {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(r.Uint32())
		}
		want := sha256.Sum256(msg)
		if got := Sum256(msg); got != want {
			t.Fatalf("len %d: %x, want %x", n, got, want)
		}
		cut := r.IntN(n + 1)
		if got := Sum256(msg[:cut], nil, msg[cut:]); got != want {
			t.Fatalf("len %d split at %d: %x, want %x", n, cut, got, want)
		}
	}
}
