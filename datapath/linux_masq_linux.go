package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// masqTable is the nftables table (family inet) holding the masquerade
// chain; Membrane owns it whole and rewrites it at every Init.
const masqTable = "membrane"

// ensureMasquerade makes the inet table "membrane" hold one NAT
// postrouting chain: traffic to the cluster's pod CIDRs returns (no NAT:
// pod to pod keeps its address, in native routing and through the
// tunnel); traffic from this node's pod CIDRs (and --cluster-cidr) to
// anything else is masqueraded to the outgoing interface's address (the
// node's). The cluster's pod CIDRs are --cluster-cidr, this node's and
// every remote node's (SyncNodes rewrites the chain as nodes come and
// go); Init starts from the remote pod CIDRs the node routes a previous
// agent left hold, so a restart never masquerades pod-to-pod traffic.
// Init calls it when masquerading is on (removeMasquerade when off). The
// kernel's conntrack reverses the translation for replies before the
// endpoint programs see them.
func (l *Linux) ensureMasquerade() error {
	have, err := l.nl.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: nodeRouteProto, Table: unix.RT_TABLE_MAIN},
		netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
	if err != nil {
		return fmt.Errorf("masquerade: list node routes: %w", err)
	}
	var remote []netip.Prefix
	for _, r := range have {
		if p, ok := netPrefix(r.Dst); ok {
			remote = append(remote, p)
		}
	}
	l.nodes.mu.Lock()
	defer l.nodes.mu.Unlock()
	return l.writeMasquerade(remote)
}

// syncMasquerade rewrites the chain when the remote nodes' pod CIDRs
// changed (SyncNodes, under l.nodes.mu).
func (l *Linux) syncMasquerade(nodes []RemoteNode) error {
	if !l.cfg.Nodes.Masquerade {
		return nil
	}
	var remote []netip.Prefix
	for _, n := range nodes {
		remote = append(remote, n.PodCIDRs...)
	}
	if slices.Equal(coverPrefixes(remote), l.nodes.masqRemote) {
		return nil
	}
	return l.writeMasquerade(remote)
}

// masqRules are what the masquerade chain does: traffic to a prefix of
// Cluster is left alone, other traffic from a prefix of Sources is
// masqueraded.
type masqRules struct {
	Cluster, Sources []netip.Prefix
}

// masqueradeCIDRs is the chain's content for the remote pod CIDRs.
func (l *Linux) masqueradeCIDRs(remote []netip.Prefix) masqRules {
	c := l.cfg.Nodes
	return masqRules{
		Cluster: coverPrefixes(slices.Concat(c.ClusterCIDRs, c.LocalPodCIDRs, remote)),
		Sources: coverPrefixes(slices.Concat(c.ClusterCIDRs, c.LocalPodCIDRs)),
	}
}

// writeMasquerade replaces the chain's rules in one nftables transaction
// (the table and chain made if missing, the chain flushed, the rules
// added): no packet ever sees a half-written chain. l.nodes.mu is held.
func (l *Linux) writeMasquerade(remote []netip.Prefix) error {
	var opts []nftables.ConnOption
	if l.ns != nil {
		opts = append(opts, nftables.WithNetNSFd(int(l.ns.handle)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("masquerade: nftables: %w", err)
	}
	defer c.CloseLasting()
	m := l.masqueradeCIDRs(remote)
	t := c.AddTable(&nftables.Table{Name: masqTable, Family: nftables.TableFamilyINet})
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.FlushChain(ch)
	for _, p := range m.Cluster {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(matchPrefix(p, false), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	for _, p := range m.Sources {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(matchPrefix(p, true), &expr.Masq{})})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("masquerade: write table %s: %w", masqTable, err)
	}
	l.nodes.masqRemote = coverPrefixes(remote)
	l.log.Info("masquerade", "not-to", m.Cluster, "from", m.Sources)
	return nil
}

// removeMasquerade deletes the table a previous agent with masquerading
// on left (Init with it off); a missing table is fine.
func (l *Linux) removeMasquerade() error {
	var opts []nftables.ConnOption
	if l.ns != nil {
		opts = append(opts, nftables.WithNetNSFd(int(l.ns.handle)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("masquerade: nftables: %w", err)
	}
	defer c.CloseLasting()
	c.DelTable(&nftables.Table{Name: masqTable, Family: nftables.TableFamilyINet})
	if err := c.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("masquerade: delete table %s: %w", masqTable, err)
	}
	return nil
}

// matchPrefix matches the packets whose source (src) or destination
// address is in p: meta nfproto, then the masked address.
func matchPrefix(p netip.Prefix, src bool) []expr.Any {
	proto, off := byte(unix.NFPROTO_IPV4), uint32(16)
	if src {
		off = 12
	}
	if p.Addr().Is6() {
		proto, off = unix.NFPROTO_IPV6, 24
		if src {
			off = 8
		}
	}
	n := uint32(p.Addr().BitLen() / 8)
	mask := make([]byte, n)
	for i := 0; i < p.Bits(); i++ {
		mask[i/8] |= 0x80 >> (i % 8)
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}
