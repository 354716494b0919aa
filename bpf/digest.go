package bpf

import (
	"crypto/sha256"
	"encoding/hex"
	"sync"
)

var endpointDigest = sync.OnceValue(func() string {
	sum := sha256.Sum256(_EndpointBytes)
	return hex.EncodeToString(sum[:8])
})

// EndpointObjectDigest names this build's endpoint object (the first 8
// bytes of the SHA-256 of the embedded ELF for the host's byte order, in
// hex): datapath/ pins the node's loaded endpoint programs under it, so
// that a restarted agent of the same build reuses them and one of
// another build loads its own.
func EndpointObjectDigest() string { return endpointDigest() }
