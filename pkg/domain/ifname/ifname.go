// Package ifname checks interface names before they reach a path, a
// netlink call or a label. It imports nothing of ours, so the CNI plugin
// and the delete queue use it without pulling in the agent.
package ifname

import (
	"strconv"
	"strings"
)

// Interface names. The kernel limits a name to IFNAMSIZ-1 = 15 bytes;
// the names below are also used as path elements
// (/proc/sys/net/ipv4/conf/<dev>/...) and file names, so they are checked
// before they reach a path, a netlink call or a label.
const (
	// MaxLen is IFNAMSIZ less the terminating NUL.
	MaxLen = 15
	// HostPrefix starts every host-side interface membrane-cni creates
	// (lxc plus 12 hex digits of a hash of the attachment).
	HostPrefix = "lxc"
	// Health is the host side of the agent's health endpoint veth
	// (Cilium's name). The agent makes it itself; no client may name it.
	Health = "lxc_health"
)

// Valid reports whether name is a Linux interface name the kernel
// accepts and that is safe as a path element: 1..15 bytes, not "." or
// "..", no '/', ':', '%', whitespace or control characters. (The kernel
// accepts ':' only for aliases and '%' only as a template; neither names
// a pod interface.) "all" and "default" are refused too: they are the
// sysctl directories of every interface.
func Valid(name string) bool {
	if name == "" || len(name) > MaxLen || name == "." || name == ".." || name == "all" || name == "default" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || c == '/' || c == ':' || c == '%' {
			return false
		}
	}
	return true
}

// ValidHost reports whether name has the pattern of the host-side
// interfaces membrane-cni creates: "lxc" followed by 1..12 lowercase
// letters or digits (the plugin uses 12 hex digits; tests and
// benchmarks make their own veths with shorter suffixes). Clients
// (API, delete queue) may name only these; the garbage collector deletes
// only these; never the host's eth0, membrane_host or lxc_health.
func ValidHost(name string) bool {
	if len(name) <= len(HostPrefix) || len(name) > MaxLen || name[:len(HostPrefix)] != HostPrefix {
		return false
	}
	for i := len(HostPrefix); i < len(name); i++ {
		c := name[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// Managed reports whether name is a host interface the agent manages:
// one of the plugin's (ValidHost) or the health endpoint's. The datapath
// realises and removes only these.
func Managed(name string) bool {
	return name == Health || ValidHost(name)
}

// TombstonePrefix starts the name a deleted attachment's veth ends take
// until the pair is deleted: "lxc-" is no client's name (ValidHost wants
// a letter or digit after "lxc") and no pod's usual CNI_IFNAME, so the
// attachment's own names are free for the next ADD at once.
const TombstonePrefix = "lxc-"

// Tombstone returns the tombstone name of the interface with ifindex
// index (unique in its netns, so two tombstones never collide there).
func Tombstone(index int) string {
	return TombstonePrefix + strconv.FormatUint(uint64(uint32(index)), 36)
}

// IsTombstoneOf reports whether name is Tombstone(index): the name the
// agent gives a host veth it set aside, which encodes the veth's own
// interface index. A veth of another program that only looks like a
// tombstone (IsTombstone) is not one of these, but for a chance of one in
// the index space.
func IsTombstoneOf(name string, index int) bool {
	return IsTombstone(name) && name == Tombstone(index)
}

// IsTombstone reports whether name has Tombstone's pattern: "lxc-"
// followed by 1..7 lowercase letters or digits.
func IsTombstone(name string) bool {
	rest, ok := strings.CutPrefix(name, TombstonePrefix)
	if !ok || rest == "" || len(rest) > 7 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}
