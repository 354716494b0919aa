//go:build !linux

package datapath

import (
	"errors"
	"net/netip"
)

// OrigDst is Linux only.
func OrigDst([]byte) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("original destination: not supported on this system")
}

// OrigDstOOBSize is Linux only.
var OrigDstOOBSize = 64
