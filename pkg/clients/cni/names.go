package cni

import (
	"crypto/sha256"
	"encoding/hex"
)

// Veth names are derived from the container ID so that every CNI call
// for the same attachment finds the same links: "lxc" or "tmp" plus the
// first 12 hex digits of SHA-256(container ID) is 15 bytes, IFNAMSIZ-1.
const (
	hostPrefix = "lxc"
	tmpPrefix  = "tmp"
	hashLen    = 12
)

// VethNames returns the host-side name (lxc<hash>) and the temporary
// name the peer has in the pod's netns before it is renamed (tmp<hash>).
func VethNames(containerID string) (host, tmp string) {
	sum := sha256.Sum256([]byte(containerID))
	h := hex.EncodeToString(sum[:])[:hashLen]
	return hostPrefix + h, tmpPrefix + h
}
