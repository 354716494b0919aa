package testutil

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// pingSeq numbers the echo requests of Ping, so that a late reply to an
// earlier probe is never taken for this one's.
var pingSeq atomic.Uint32

// Ping sends one ICMP (ICMPv6) echo request from inside ns to addr and
// waits at most timeout (a bound for a request that policy drops, not a
// timing assertion) for its reply: the request and the reply both pass.
func Ping(ns *NS, addr netip.Addr, timeout time.Duration) error {
	return ns.Do(func() error {
		network, listen, proto := "ip4:icmp", "0.0.0.0", 1
		var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
		if addr.Is6() {
			network, listen, proto = "ip6:ipv6-icmp", "::", 58
			typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
		}
		c, err := icmp.ListenPacket(network, listen)
		if err != nil {
			return err
		}
		defer c.Close()
		id, seq := os.Getpid()&0xffff, int(pingSeq.Add(1)&0xffff)
		payload := []byte(fmt.Sprintf("membrane-%d", seq))
		msg, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}).Marshal(nil)
		if err != nil {
			return err
		}
		dst := &net.IPAddr{IP: addr.AsSlice()}
		if _, err := c.WriteTo(msg, dst); err != nil {
			return err
		}
		deadline := time.Now().Add(timeout)
		_ = c.SetReadDeadline(deadline)
		buf := make([]byte, 1500)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("no echo reply from %s: %w", addr, err)
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply {
				continue
			}
			e, ok := m.Body.(*icmp.Echo)
			if ok && e.Seq == seq && bytes.Equal(e.Data, payload) && from.String() == addr.String() {
				return nil
			}
		}
	})
}
