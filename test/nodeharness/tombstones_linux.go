package nodeharness

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Tombstones returns the names of the tombstone links (ifname.Tombstone:
// a deleted endpoint's veth ends, renamed until their deferred deletion)
// in ns.
func Tombstones(tb testing.TB, ns *testutil.NS) []string {
	tb.Helper()
	// A dump the kernel interrupted (links came or went meanwhile: the
	// agent deleting tombstones) is taken again.
	links, err := ns.Netlink(tb).LinkList()
	for i := 0; errors.Is(err, netlink.ErrDumpInterrupted) && i < 20; i++ {
		links, err = ns.Netlink(tb).LinkList()
	}
	if err != nil {
		tb.Fatal(err)
	}
	var names []string
	for _, l := range links {
		if ifname.IsTombstone(l.Attrs().Name) {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
}
