package cni

import "github.com/membrane-cni/membrane/datapath/podnet"

// VethNames returns the host-side name (lxc<hash>) and the temporary
// name (tmp<hash>) of an attachment's veth (podnet.VethNames).
func VethNames(containerID, ifName string) (host, tmp string) {
	return podnet.VethNames(containerID, ifName)
}
