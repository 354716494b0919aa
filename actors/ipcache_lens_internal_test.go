package actors

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestIPCacheLookupLengths: the ipcache actor tells the index which
// prefix lengths it holds (IPCacheLookup looks up only those), keeps it
// true as prefixes of a new length come and the last of a length goes,
// and again after a restart rebuilt it from the table: a longest prefix
// match still finds every entry, and a dropped length is not looked up.
func TestIPCacheLookupLengths(t *testing.T) {
	sys, _ := svSystem(t, nil)
	ix := sys.deps.ix
	cidr := netip.MustParsePrefix("203.0.113.0/24")
	in, out := netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("198.51.100.77")
	const cidrID = identity.NumericIdentity(16777300)
	lens := func() *index.IPCacheLengths { return ix.IPCacheLengthsNow() }
	cidrs := func(up map[netip.Prefix]identity.NumericIdentity, del ...netip.Prefix) {
		sys.Actors.Root.Send(sys.deps.ipcache, &messages.IPCacheCIDRs{Upserts: up, Deletes: del})
	}
	// The policy actor owns the CIDR claims: at its start it drops the
	// ones it does not hold. Wait for its start before claiming.
	if _, err := sys.FQDNCache(t.Context()); err != nil {
		t.Fatal(err)
	}
	cidrs(map[netip.Prefix]identity.NumericIdentity{cidr: cidrID})
	testutil.Eventually(t, "the /24 found by an address in it, its length published", func() bool {
		id, ok := ix.IPCacheLookup(in)
		l := lens()
		return ok && id == cidrID && l != nil && l.Has(0, 24)
	})
	if _, ok := ix.IPCacheLookup(out); ok {
		t.Fatalf("%s outside every prefix matched", out)
	}
	sys.Actors.Root.Send(sys.deps.ipcache, &crashForTest{})
	testutil.Eventually(t, "the lengths rebuilt after a restart", func() bool {
		sys.Actors.Root.Send(sys.deps.ipcache, &messages.IPCacheHostAddr{Addr: netip.MustParseAddr("198.51.100.1")})
		l := lens()
		return l != nil && l.Has(0, 24) && l.Has(0, 32)
	})
	if id, ok := ix.IPCacheLookup(in); !ok || id != cidrID {
		t.Fatalf("after the restart %s -> %d, %v; want %d", in, id, ok, cidrID)
	}
	cidrs(nil, cidr)
	testutil.Eventually(t, "the /24 gone and its length with it", func() bool {
		_, ok := ix.IPCacheLookup(in)
		l := lens()
		return !ok && l != nil && !l.Has(0, 24) && l.Has(0, 32)
	})
}
