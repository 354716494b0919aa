package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestBPFFlowsBench measures what flow reports cost (make bench-bpf;
// BENCHMARKS.md), flows off and on in the same run, rounds interleaved:
//   - per packet, in the kernel (BPF_PROG_TEST_RUN): a packet of an
//     established connection (no report either way) and the first packet
//     of a new one (the report: flow_config read, ring reserve and
//     submit, a revnat lookup only for a Service's);
//   - per new connection end to end: TCP connections between two pods on
//     real veths, with the agent side's reader draining the ring;
//   - an endpoint's first realise (the CNI ADD's datapath part), which
//     flows do not touch.
//
// Runs only with MEMBRANE_BENCH_BPF=1.
func TestBPFFlowsBench(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_BPF") == "" {
		t.Skip("set MEMBRANE_BENCH_BPF=1 (make bench-bpf)")
	}
	t.Run("per-packet", benchFlowsPackets)
	t.Run("connections", benchFlowsConnections)
	t.Run("realize", benchFlowsRealize)
}

// drainFlows reads the flow ring until the test ends, as the agent does.
func drainFlows(t *testing.T, b *bpfState) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var rec ringbuf.Record
		for {
			if err := b.flows.ReadInto(&rec); errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			_, _ = decodeFlow(rec.RawSample)
		}
	}()
	t.Cleanup(func() { b.flows.Close(); <-done })
}

func benchFlowsPackets(t *testing.T) {
	h := newProgHarness(t, 41, 1041)
	drainFlows(t, h.b)
	h.ipcache(t, "10.0.0.20/32", 2020)
	// Enforced egress allowing the peer: the full policy path.
	h.setPolicy(t, policy.NewMapState(1, false, true, []policy.Key{{Identity: 2020, Dir: policy.Egress}}))
	peer := netip.MustParseAddr("10.0.0.20")
	const rounds, estRepeat, newConns = 5, 200000, 20000
	var est, fresh [2][]time.Duration
	sport := uint16(1024)
	for r := range rounds {
		for _, on := range []bool{false, true} {
			if err := h.b.setFlows(on); err != nil {
				t.Fatal(err)
			}
			i := 0
			if on {
				i = 1
			}
			// Established: one connection, recorded by a first run.
			p := pkt{src: podIP, dst: peer, proto: policy.ProtoTCP, sport: 40000 + uint16(r*2+i), dport: 80}
			if v := h.run(t, policy.Egress, p); v != verdictPass {
				t.Fatalf("verdict %d", v)
			}
			_, d, err := h.progs.from.Benchmark(p.bytes(), estRepeat, nil)
			if err != nil {
				t.Fatal(err)
			}
			est[i] = append(est[i], d)
			// New connections: a new source port each.
			var sum time.Duration
			for range newConns / rounds {
				sport++
				if sport < 1024 {
					sport = 1024
				}
				p := pkt{src: podIP, dst: peer, proto: policy.ProtoTCP, sport: sport, dport: uint16(81 + r*2 + i)}
				_, d, err := h.progs.from.Benchmark(p.bytes(), 1, nil)
				if err != nil {
					t.Fatal(err)
				}
				sum += d
			}
			fresh[i] = append(fresh[i], sum/time.Duration(newConns/rounds))
		}
	}
	st, _ := (&Linux{bpf: h.b}).FlowStats()
	for i, name := range []string{"off", "on"} {
		t.Logf("flows %s: established packet median %v of %d rounds (%v); new connection's first packet median %v (%v)",
			name, medianDur(est[i]), rounds, est[i], medianDur(fresh[i]), fresh[i])
	}
	t.Logf("flow stats: %+v", st)
}

func medianDur(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func benchFlowsConnections(t *testing.T) {
	e, fl := newFlowsE2E(t)
	const rounds, conns = 5, 200
	var took [2][]time.Duration
	for range rounds {
		for i, on := range []bool{false, true} {
			if err := e.l.SetFlows(on); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			for range conns {
				e.mustTalk(e.a, e.b, 8080)
			}
			took[i] = append(took[i], time.Since(start)/conns)
		}
	}
	for i, name := range []string{"off", "on"} {
		t.Logf("flows %s: a TCP connection between two pods (connect, one message each way, close) median %v of %d rounds of %d (%v)",
			name, medianDur(took[i]), rounds, conns, took[i])
	}
	testutil.Eventually(t, "the flows read", func() bool { return len(fl.match(func(FlowEvent) bool { return true })) >= 2*rounds*conns })
	st, _ := e.l.FlowStats()
	t.Logf("flow stats: %+v", st)
}

func benchFlowsRealize(t *testing.T) {
	const n = 100
	var took [2]stats
	for i, on := range []bool{false, true} {
		l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, Flows: on})
		eps := make([]*endpoint.Endpoint, n)
		for j := range eps {
			eps[j] = benchVeth(t, nl, endpoint.ID(j+1), fmt.Sprintf("lxcf%d%05d", i, j), fmt.Sprintf("10.247.%d.%d", j/250, j%250+1))
			eps[j].Identity = identity.NumericIdentity(1000 + j)
			eps[j].Policy = benchPolicy(1, 0)
		}
		took[i] = measure(t, eps, func(ep *endpoint.Endpoint) error { _, err := l.Realize(t.Context(), ep, 1); return err })
	}
	t.Logf("first realise of %d endpoints, flows off: %v", n, took[0])
	t.Logf("first realise of %d endpoints, flows on: %v", n, took[1])
}
