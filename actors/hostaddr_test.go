package actors_test

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// ipcacheIdentity is p's identity in the index's ipcache (0: absent).
func (h *harness) ipcacheIdentity(p netip.Prefix) identity.NumericIdentity {
	for _, e := range h.ix.IPCache() {
		if e.Prefix == p {
			return e.Identity
		}
	}
	return 0
}

// TestHostAddrChanged: an address the host gains is the host identity in
// the ipcache until the host loses it; changes inside the pod ranges
// (the gateway, endpoint addresses) are not the host's and change nothing.
func TestHostAddrChanged(t *testing.T) {
	h := startSystem(t, nil)
	gw := netip.MustParsePrefix("10.200.0.1/32") // testIPv4's gateway
	testutil.Eventually(t, "gateway is host", func() bool { return h.ipcacheIdentity(gw) == identity.ReservedHost })

	added := netip.MustParseAddr("192.0.2.9")
	p := netip.PrefixFrom(added, 32)
	h.sys.HostAddrChanged(added, false)
	testutil.Eventually(t, "added address is host", func() bool { return h.ipcacheIdentity(p) == identity.ReservedHost })

	h.sys.HostAddrChanged(gw.Addr(), true) // ignored: inside the pod range
	inRange := netip.MustParseAddr("10.200.0.77")
	h.sys.HostAddrChanged(inRange, false) // ignored too
	h.sys.HostAddrChanged(added, true)
	// The messages are handled in order: once the last one took effect,
	// the ignored ones were handled before it.
	testutil.Eventually(t, "removed address gone", func() bool { return h.ipcacheIdentity(p) == 0 })
	if id := h.ipcacheIdentity(gw); id != identity.ReservedHost {
		t.Fatalf("gateway identity %d after a host address change in the pod range, want host", id)
	}
	if id := h.ipcacheIdentity(netip.PrefixFrom(inRange, 32)); id != 0 {
		t.Fatalf("pod-range address claimed as %d by a host address change", id)
	}
}
