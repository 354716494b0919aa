package dnsproxy

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// compressedAnswer returns the server's answer to q with two A records,
// packed with name compression (miekg/dns packs a message it unpacked
// without it: the proxy's own packing differs).
func compressedAnswer(t *testing.T, q *dns.Msg) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetReply(q)
	for _, ip := range []net.IP{net.IPv4(192, 0, 2, 10), net.IPv4(192, 0, 2, 11)} {
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 7}, A: ip})
	}
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestExchangeUDPAnswerAsSent: the upstream exchange skips a datagram
// with another ID (an earlier query's late answer), returns the answer
// with the query's ID unpacked and byte for byte as the server sent it,
// and the pod gets those very bytes (not the proxy's own packing of
// them) when they fit what its query allows; else the answer is cut to
// that size with the TC bit.
func TestExchangeUDPAnswerAsSent(t *testing.T) {
	testutil.RequireRoot(t) // the reply socket is transparent
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	q := question("allowed.test.")
	sent := compressedAnswer(t, q)
	go func() {
		buf := make([]byte, 512)
		_, from, err := srv.ReadFromUDP(buf)
		if err != nil {
			return
		}
		late := bytes.Clone(sent)
		late[0] ^= 0xff // another ID
		_, _ = srv.WriteToUDP(late, from)
		_, _ = srv.WriteToUDP(sent, from)
	}()
	conn, err := net.Dial("udp4", srv.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, raw, err := exchangeUDP(ctx, conn, q)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Id != q.Id || len(resp.Answer) != 2 || !bytes.Equal(raw, sent) {
		t.Fatalf("answer %v, bytes %x, want the server's %x", resp, raw, sent)
	}
	packed, err := resp.Pack()
	if err != nil || bytes.Equal(packed, sent) {
		t.Fatalf("the proxy's packing equals the server's (%v): the test shows nothing", err)
	}

	// The reply to the pod, from a transparent socket at the server's
	// address (here another loopback port).
	p := newProxy(t, Config{Port: 1}, fixture(t, 53), &recorder{learned: map[string][]netip.Addr{}}, nil)
	defer p.closeReplies()
	pod, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pod.Close()
	from := netip.MustParseAddrPort("127.0.0.1:" + freeUDPPort(t))
	to := netip.MustParseAddrPort(pod.LocalAddr().String())
	got := func() []byte {
		t.Helper()
		_ = pod.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 4096)
		n, err := pod.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		return buf[:n]
	}
	if err := p.replyUDP(from, to, q, resp, raw); err != nil {
		t.Fatal(err)
	}
	if b := got(); !bytes.Equal(b, sent) {
		t.Fatalf("pod got %x, want the server's bytes %x", b, sent)
	}
	// Larger than the query allows (512 without EDNS0): cut, TC set.
	big := resp.Copy()
	for i := range 60 {
		big.Answer = append(big.Answer, &dns.A{Hdr: dns.RR_Header{Name: "allowed.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 7}, A: net.IPv4(198, 51, 100, byte(i))})
	}
	bigRaw, err := big.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.replyUDP(from, to, q, big, bigRaw); err != nil {
		t.Fatal(err)
	}
	cut := new(dns.Msg)
	if b := got(); len(b) > dns.MinMsgSize || cut.Unpack(b) != nil || !cut.Truncated {
		t.Fatalf("oversized answer: %d bytes, truncated %v", len(b), cut.Truncated)
	}
}

// freeUDPPort returns a loopback UDP port nothing listens on now.
func freeUDPPort(t *testing.T) string {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, port, _ := net.SplitHostPort(c.LocalAddr().String())
	return port
}
