package actors

import (
	"net/netip"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestReservedSetAcrossRestart: a reserved set (other nodes' addresses)
// replaces its own claims only, and after an ipcache actor restart
// (state rebuilt from the index) a shrinking set still drops the
// addresses it no longer names: the per-source index the set visits is
// rebuilt with the entries.
func TestReservedSetAcrossRestart(t *testing.T) {
	sys, _ := svSystem(t, nil)
	a, b, c := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2"), netip.MustParseAddr("198.51.100.3")
	ident := func(ip netip.Addr) identity.NumericIdentity {
		for _, e := range sys.deps.ix.IPCache() {
			if e.Prefix == netip.PrefixFrom(ip, 32) {
				return e.Identity
			}
		}
		return 0
	}
	set := func(source string, addrs ...netip.Addr) {
		sys.Actors.Root.Send(sys.deps.ipcache, &messages.IPCacheReservedSet{Source: source, Addrs: addrs})
	}
	set(index.SourceNode, a, b)
	set(index.SourceKubeAPIServer, c)
	testutil.Eventually(t, "nodes a, b and the API server c", func() bool {
		return ident(a) == identity.ReservedRemoteNode && ident(b) == identity.ReservedRemoteNode && ident(c) == identity.ReservedKubeAPIServer
	})
	sys.Actors.Root.Send(sys.deps.ipcache, &crashForTest{})
	time.Sleep(50 * time.Millisecond) // the restart rebuilds from the index
	set(index.SourceNode, a)
	testutil.Eventually(t, "node b gone after the restart, a and the API server kept", func() bool {
		return ident(a) == identity.ReservedRemoteNode && ident(b) == 0 && ident(c) == identity.ReservedKubeAPIServer
	})
	set(index.SourceKubeAPIServer)
	testutil.Eventually(t, "the API server's address gone", func() bool { return ident(c) == 0 && ident(a) == identity.ReservedRemoteNode })
}
