package datapath

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// BenchmarkBPFEstablishedTCP is the endpoint programs' run time on a
// TCP packet of an established connection (BPF_PROG_TEST_RUN, repeated
// in the kernel; issue 39): the original direction (a conntrack miss of
// the reply tuple, then the entry refreshed) and the reply direction
// (a conntrack hit), each with the direction unenforced and enforced
// (an allow-all policy entry for the peer: the enforce entry, the
// ipcache and the policy map looked up on every packet). ns/pkt is the
// kernel's average over repeat runs. The test run's device is the
// loopback: the FIB finds no local endpoint behind it, so
// local_deliver's redirect is not part of it. Measurement, not a test.
func BenchmarkBPFEstablishedTCP(b *testing.B) {
	for _, enforced := range []bool{false, true} {
		name := "unenforced"
		if enforced {
			name = "enforced"
		}
		b.Run(name, func(b *testing.B) {
			h := newPolicyHarness(b)
			if enforced {
				h.setPolicy(b, policy.NewMapState(1, true, true, []policy.Key{
					{Identity: identA, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress},
					{Identity: identA, Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Egress},
				}))
			}
			out := conn(policy.Egress, peerA, policy.ProtoTCP, 8080)
			in := conn(policy.Ingress, peerA, policy.ProtoTCP, 8080)
			for _, c := range []struct {
				name string
				dir  policy.Direction
				p    pkt
			}{
				{"egress-original", policy.Egress, out},
				{"ingress-reply", policy.Ingress, out.reply()},
				{"ingress-original", policy.Ingress, in},
				{"egress-reply", policy.Egress, in.reply()},
			} {
				b.Run(c.name, func(b *testing.B) {
					prog := h.progs.to
					if c.dir == policy.Egress {
						prog = h.progs.from
					}
					if got := h.run(b, c.dir, c.p); got != verdictPass {
						b.Fatalf("verdict %d, want pass", got)
					}
					_, d, err := prog.Benchmark(c.p.bytes(), b.N, nil)
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(float64(d.Nanoseconds()), "ns/pkt")
				})
			}
		})
	}
}
