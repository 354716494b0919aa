package datapath

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/datapath/sysctl"
)

// DefaultNodePortRange is Kubernetes' default --service-node-port-range.
var DefaultNodePortRange = [2]uint16{30000, 32767}

// protectNodePortRange keeps the kernel from choosing a NodePort number
// as the source port of a host connection, as Cilium's
// --enable-auto-protect-node-port-range does: when
// net.ipv4.ip_local_port_range overlaps the NodePort range, the range is
// added to net.ipv4.ip_local_reserved_ports (kept with what is there).
// from_netdev takes a packet to a node address and a NodePort for
// NodePort traffic, so the replies of such a connection would be
// translated to a Service's backend. Run in the host netns (both
// parameters are per network namespace; IPv4's apply to IPv6 too).
func protectNodePortRange(r [2]uint16) (changed bool, err error) {
	cur, err := os.ReadFile(sysctl.Path("net/ipv4/ip_local_port_range"))
	if err != nil {
		return false, fmt.Errorf("protect the NodePort range: %w", err)
	}
	f := strings.Fields(string(cur))
	if len(f) != 2 {
		return false, fmt.Errorf("protect the NodePort range: ip_local_port_range %q: want two numbers", strings.TrimSpace(string(cur)))
	}
	lo, err1 := strconv.ParseUint(f[0], 10, 16)
	hi, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil {
		return false, fmt.Errorf("protect the NodePort range: ip_local_port_range %q: want two port numbers", strings.TrimSpace(string(cur)))
	}
	if uint16(hi) < r[0] || uint16(lo) > r[1] {
		return false, nil // no ephemeral port is a NodePort
	}
	path := sysctl.Path("net/ipv4/ip_local_reserved_ports")
	res, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("protect the NodePort range: %w", err)
	}
	have := strings.TrimSpace(string(res))
	if reservedCovers(have, r) {
		return false, nil
	}
	want := fmt.Sprintf("%d-%d", r[0], r[1])
	if have != "" {
		want = have + "," + want
	}
	if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
		return false, fmt.Errorf("protect the NodePort range: reserve %d-%d: %w", r[0], r[1], err)
	}
	return true, nil
}

// reservedCovers reports whether the reserved ports list (the kernel's
// form: "a,b-c,...", ranges merged and sorted) holds all of r.
func reservedCovers(list string, r [2]uint16) bool {
	for item := range strings.SplitSeq(list, ",") {
		a, b, isRange := strings.Cut(strings.TrimSpace(item), "-")
		if !isRange {
			b = a
		}
		lo, err1 := strconv.ParseUint(a, 10, 16)
		hi, err2 := strconv.ParseUint(b, 10, 16)
		if err1 == nil && err2 == nil && uint16(lo) <= r[0] && uint16(hi) >= r[1] {
			return true
		}
	}
	return false
}
