package kvstore

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
)

// RefHash exposes refHash to the tests.
var RefHash = refHash

// Dump describes the mirror's claims for a test's failure message: each
// address's owner and earlier claims, the refused records and the nodes.
func (m *Mirror) Dump() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var b strings.Builder
	for _, ip := range slices.SortedFunc(maps.Keys(m.owners), func(a, b netip.Addr) int { return a.Compare(b) }) {
		k := m.owners[ip]
		fmt.Fprintf(&b, "%s: owner %s (identity %d)", ip, k, m.recs[k].identity)
		if c := m.contested[ip]; len(c) > 0 {
			fmt.Fprintf(&b, ", earlier %v", c)
		}
		b.WriteString("; ")
	}
	fmt.Fprintf(&b, "refused %v; nodes %v", m.refused, slices.Sorted(maps.Keys(m.nodeRecs)))
	return b.String()
}

// SetMaxPending sets the bound of the mirror's queue until the test ends.
func SetMaxPending(tb interface{ Cleanup(func()) }, n int) {
	old := maxPending
	maxPending = n
	tb.Cleanup(func() { maxPending = old })
}

// GCPasses counts the collection passes the backend's gc loop ran.
func (b *IdentityBackend) GCPasses() uint64 { return b.gc.passes.Load() }

// LapseKeepAlive makes the lease's keep-alive lapse as if its answers
// stopped coming (etcd still holds the lease).
func (c *Client) LapseKeepAlive() { c.lapse <- struct{}{} }
