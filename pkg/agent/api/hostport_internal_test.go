package api

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// TestHostPortOfHostIP: a mapping's host-ip is a node address, the
// node's localhost (127.0.0.1, ::1: only the node's own sockets reach
// the pod through it), or unspecified (0.0.0.0, ::, as Kubernetes means
// it: every node address); anything else is refused.
func TestHostPortOfHostIP(t *testing.T) {
	for _, tc := range []struct {
		hostIP string
		want   netip.Addr
		ok     bool
	}{
		{"", netip.Addr{}, true},
		{"0.0.0.0", netip.Addr{}, true},
		{"::", netip.Addr{}, true},
		{"127.0.0.1", netip.MustParseAddr("127.0.0.1"), true},
		{"::1", netip.MustParseAddr("::1"), true},
		{"10.1.2.3", netip.MustParseAddr("10.1.2.3"), true},
		{"224.0.0.1", netip.Addr{}, false},
		{"fe80::1", netip.Addr{}, false},
		{"::ffff:10.1.2.3", netip.Addr{}, false},
		{"localhost", netip.Addr{}, false},
	} {
		h, err := hostPortOf(models.PortMapping{HostPort: 80, ContainerPort: 8080, Protocol: "tcp", HostIP: tc.hostIP})
		if (err == nil) != tc.ok || (err == nil && h.HostIP != tc.want) {
			t.Errorf("host-ip %q: %v, %v; want %v (accepted %v)", tc.hostIP, h.HostIP, err, tc.want, tc.ok)
		}
	}
}
