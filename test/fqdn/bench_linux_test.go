package fqdn

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// benchName answers h<N>.test (N < 65536) with 198.18.<N/256>.<N%256>:
// a new address per name, so that each answer changes the policy.
func benchName(name string) (netip.Addr, bool) {
	s, ok := strings.CutPrefix(strings.ToLower(name), "h")
	if !ok {
		return netip.Addr{}, false
	}
	s, ok = strings.CutSuffix(s, ".test.")
	if !ok {
		return netip.Addr{}, false
	}
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte{198, 18, byte(n >> 8), byte(n)}), true
}

// benchQueries is how many queries each measured series sends (the
// per-endpoint bound on learned addresses is 1000: the new-address
// series stays below it).
const benchQueries = 400

// BenchmarkDNSProxyDelay measures the DNS answer delay the proxy adds:
// the same queries from pod A (toFQDNs policy: its DNS is redirected to
// the proxy, which holds each answer until its address is realised;
// toFQDNs *.test selects every answer) and
// from pod B (no policy: straight to the server), interleaved in one run.
// Series: "cached" repeats allowed.test (the address is known: the hold
// is the policy actor's learn and an ipcache barrier); "new" asks a new
// name each time (every answer adds an address: a regeneration of A's
// policy map before release). Reports p50 and p99 in microseconds. The
// floor of one more hop is measured in the same run: the cached series
// from pod B through a bare UDP relay in the node's netns (read, forward
// on one connected socket, read, answer: no policy, no socket per
// query), "relay-p50-us". With -v it logs the mean of each regeneration
// and datapath phase over each series (the agent's histograms).
//
//	go test -run XXX -bench DNSProxyDelay -benchtime 1x ./test/fqdn/
func BenchmarkDNSProxyDelay(b *testing.B) {
	e := newEnvTB(b)
	e.importPolicyFQDN(`matchPattern: "*.test"`, `matchPattern: "*.test"`)
	podB, _, _, _ := e.addPod("b")
	relay := udpRelay(b, e.node.NS, netip.AddrPortFrom(dnsAddr, 53))
	for range b.N {
		for _, series := range []string{"cached", "new"} {
			var viaProxy, direct, relayed []time.Duration
			sum0, n0 := e.holdSum(b)
			phases0 := e.phaseSums(b)
			for i := range benchQueries {
				name := "allowed.test"
				if series == "new" {
					name = fmt.Sprintf("h%d.test", i)
				}
				for _, p := range []struct {
					ns  *testutil.NS
					out *[]time.Duration
				}{{e.pod, &viaProxy}, {podB, &direct}} {
					d, err := timedResolve(p.ns, name)
					if err != nil {
						b.Fatalf("%s query %d: %v", series, i, err)
					}
					*p.out = append(*p.out, d)
				}
				if series == "cached" {
					d, err := timedResolveAt(podB, name, relay)
					if err != nil {
						b.Fatalf("relay query %d: %v", i, err)
					}
					relayed = append(relayed, d)
				}
			}
			if series == "cached" {
				b.ReportMetric(pct(relayed, 50), "relay-p50-us")
			}
			b.ReportMetric(pct(viaProxy, 50), series+"-proxy-p50-us")
			b.ReportMetric(pct(viaProxy, 99), series+"-proxy-p99-us")
			b.ReportMetric(pct(direct, 50), series+"-direct-p50-us")
			b.ReportMetric(pct(direct, 99), series+"-direct-p99-us")
			if sum, n := e.holdSum(b); n > n0 {
				b.ReportMetric((sum-sum0)/float64(n-n0)*1e6, series+"-hold-mean-us")
			}
			// Where a held answer's time went: the regenerations' and
			// the datapath's phases over the series (means).
			sums := e.phaseSums(b)
			for _, k := range slices.Sorted(maps.Keys(sums)) {
				if d := sums[k].n - phases0[k].n; d > 0 {
					b.Logf("%s: %s mean %.0f us over %d", series, k, (sums[k].sum-phases0[k].sum)/float64(d)*1e6, d)
				}
			}
		}
	}
}

// phaseSum is a histogram's sum (seconds) and count.
type phaseSum struct {
	sum float64
	n   uint64
}

// phaseSums reads the regeneration and datapath phase histograms, by
// "regen/<phase>" and "datapath/<phase>".
func (e *env) phaseSums(tb testing.TB) map[string]phaseSum {
	mfs, err := e.metrics.Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]phaseSum{}
	for _, mf := range mfs {
		var short string
		switch mf.GetName() {
		case "membrane_endpoint_regeneration_duration_seconds":
			short = "regen"
		case "membrane_datapath_phase_duration_seconds":
			short = "datapath"
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" {
					h := m.GetHistogram()
					out[short+"/"+l.GetValue()] = phaseSum{h.GetSampleSum(), h.GetSampleCount()}
				}
			}
		}
	}
	return out
}

// holdSum reads the proxy's hold histogram: its sum (seconds) and count.
func (e *env) holdSum(tb testing.TB) (float64, uint64) {
	mfs, err := e.metrics.Registry().Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "membrane_dns_proxy_hold_duration_seconds" && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleSum(), h.GetSampleCount()
		}
	}
	return 0, 0
}

// timedResolve times one UDP query from pod (the socket is made in the
// pod's netns outside the timed part).
func timedResolve(pod *testutil.NS, name string) (time.Duration, error) {
	return timedResolveAt(pod, name, netip.AddrPortFrom(dnsAddr, 53))
}

// timedResolveAt is timedResolve to server.
func timedResolveAt(pod *testutil.NS, name string, server netip.AddrPort) (time.Duration, error) {
	var d time.Duration
	err := pod.Do(func() error {
		c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
		conn, err := c.Dial(server.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		start := time.Now()
		resp, _, err := c.ExchangeWithConn(m, conn)
		d = time.Since(start)
		if err == nil && (resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1) {
			err = fmt.Errorf("answer %v", resp)
		}
		return err
	})
	return d, err
}

// pct returns the p-th percentile of ds in microseconds.
func pct(ds []time.Duration, p int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, (len(s)*p+99)/100-1)
	return float64(s[max(i, 0)].Microseconds())
}

// udpRelay runs a bare UDP relay in ns on nodeSide's address: each
// datagram goes to upstream on one connected socket and the reply back
// to its sender, one at a time. It returns the relay's address; it stops
// with the test.
func udpRelay(tb testing.TB, ns *testutil.NS, upstream netip.AddrPort) netip.AddrPort {
	tb.Helper()
	var lis, up *net.UDPConn
	err := ns.Do(func() (err error) {
		if lis, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(nodeSide.Addr(), 0))); err != nil {
			return err
		}
		up, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(upstream))
		return err
	})
	if err != nil {
		tb.Fatalf("relay: %v", err)
	}
	tb.Cleanup(func() { lis.Close(); up.Close() })
	go func() {
		q, a := make([]byte, 4096), make([]byte, 65535)
		for {
			n, from, err := lis.ReadFromUDPAddrPort(q)
			if err != nil {
				return
			}
			if _, err := up.Write(q[:n]); err != nil {
				return
			}
			_ = up.SetReadDeadline(time.Now().Add(5 * time.Second))
			m, err := up.Read(a)
			if err != nil {
				continue
			}
			_, _ = lis.WriteToUDPAddrPort(a[:m], from)
		}
	}()
	return netip.MustParseAddrPort(lis.LocalAddr().String())
}
