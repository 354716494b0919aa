package podnet

import (
	"encoding/hex"

	"github.com/membrane-cni/membrane/pkg/domain/namehash"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// Veth names are derived from the attachment (container ID and
// CNI_IFNAME) so that every CNI call for the same attachment finds the
// same links and two attachments of one container get different ones:
// "lxc" or "tmp" plus the first 12 hex digits of SHA-256(container ID,
// NUL, ifname) is 15 bytes, IFNAMSIZ-1.
const (
	hostPrefix = ifname.HostPrefix
	tmpPrefix  = "tmp"
	hashLen    = 12
)

// VethNames returns the host-side name (lxc<hash>) and the temporary
// name (tmp<hash>) plugins before this one gave the peer in the pod's
// netns until they renamed it: the peer is now created with its final
// name, and an ADD over a stale attachment still deletes a tmp<hash>
// such a plugin left when it was killed between the two.
func VethNames(containerID, ifName string) (host, tmp string) {
	digest := namehash.Sum256([]byte(containerID), []byte{0}, []byte(ifName))
	sum := hex.EncodeToString(digest[:])[:hashLen]
	return hostPrefix + sum, tmpPrefix + sum
}
