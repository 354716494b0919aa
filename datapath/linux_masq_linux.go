package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// masqTable is the nftables table (family inet) holding the masquerade
// chain; Membrane owns it whole and rewrites it at every Init.
const masqTable = "membrane"

// ensureMasquerade makes the inet table "membrane" hold one NAT
// postrouting chain: traffic to a cluster CIDR returns (no NAT: pod to
// pod keeps its address, in native routing and through the tunnel);
// traffic from a cluster CIDR to anything else is masqueraded to the
// outgoing interface's address (the node's). Init calls it when
// masquerading is on. The kernel's conntrack reverses the translation for
// replies before the endpoint programs see them.
func (l *Linux) ensureMasquerade() error {
	var opts []nftables.ConnOption
	if l.ns != nil {
		opts = append(opts, nftables.WithNetNSFd(int(l.ns.handle)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("masquerade: nftables: %w", err)
	}
	defer c.CloseLasting()
	t := &nftables.Table{Name: masqTable, Family: nftables.TableFamilyINet}
	// Delete whatever a previous agent left, in its own batch (a missing
	// table is fine).
	c.DelTable(t)
	if err := c.Flush(); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("masquerade: delete table %s: %w", masqTable, err)
	}
	c.AddTable(t)
	ch := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	for _, p := range l.cfg.Nodes.ClusterCIDRs {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(matchPrefix(p, false), &expr.Verdict{Kind: expr.VerdictReturn})})
	}
	for _, p := range l.cfg.Nodes.ClusterCIDRs {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(matchPrefix(p, true), &expr.Masq{})})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("masquerade: write table %s: %w", masqTable, err)
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
