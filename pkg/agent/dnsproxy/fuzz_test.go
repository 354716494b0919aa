package dnsproxy

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// FuzzAnswerAddrs: any message the DNS library unpacks gives at most one
// valid address per A/AAAA record, and a TTL no higher than any of them.
func FuzzAnswerAddrs(f *testing.F) {
	m := new(dns.Msg)
	m.SetQuestion("allowed.test.", dns.TypeA)
	m.Answer = []dns.RR{
		&dns.CNAME{Hdr: dns.RR_Header{Name: "allowed.test.", Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 9}, Target: "x.test."},
		&dns.A{Hdr: dns.RR_Header{Name: "x.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 7}, A: net.IPv4(192, 0, 2, 10)},
		&dns.AAAA{Hdr: dns.RR_Header{Name: "x.test.", Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 5}, AAAA: net.ParseIP("2001:db8::1")},
	}
	b, err := m.Pack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		msg := new(dns.Msg)
		if err := msg.Unpack(data); err != nil {
			return
		}
		ips, ttl := answerAddrs(msg)
		n := 0
		for _, rr := range msg.Answer {
			valid := false
			switch r := rr.(type) {
			case *dns.A:
				n, valid = n+1, r.A.To4() != nil
			case *dns.AAAA:
				n, valid = n+1, len(r.AAAA) == net.IPv6len
			}
			if valid && rr.Header().Ttl < ttl {
				t.Fatalf("ttl %d above a record's %d", ttl, rr.Header().Ttl)
			}
		}
		if len(ips) > n {
			t.Fatalf("%d addresses from %d address records", len(ips), n)
		}
		for _, ip := range ips {
			if !ip.IsValid() || ip.Is4In6() {
				t.Fatalf("address %v", ip)
			}
		}
	})
}
