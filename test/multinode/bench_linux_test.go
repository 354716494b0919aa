package multinode

import (
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Sizes of the measurement: bytes streamed per throughput run, runs, and
// round trips per latency run.
const (
	benchBytes      = 256 << 20
	benchRuns       = 3
	benchRoundTrips = 5000
)

// TestCrossNodeNumbers measures cross-node TCP throughput and latency
// between two pods on two nodes in native and tunnel mode, and on plain
// veths and routes without BPF or agent (the baseline), and on plain
// veths routed into a plain VXLAN device (the floor of the
// encapsulation, no BPF or agent), in one run. The arms alternate over
// xnodeRounds rounds (MEMBRANE_XNODE_ROUNDS; each round in another
// order) and every round's ratio is taken to the baseline's of the same
// round. MEMBRANE_XNODE_OLD_AGENT=<path> adds native and tunnel arms
// running the agent binary at path (an older build: before and after in
// one run). With BPF run time statistics on, it prints the time each
// Membrane hook's programs spend per round trip (the breakdown).
// Measurement, not a test: it runs only with MEMBRANE_XNODE_BENCH=1.
func TestCrossNodeNumbers(t *testing.T) {
	if os.Getenv("MEMBRANE_XNODE_BENCH") != "1" {
		t.Skip("set MEMBRANE_XNODE_BENCH=1 to measure (BENCHMARKS.md)")
	}
	testutil.RequireRoot(t)
	t.Logf("load average at start: %s", loadavg())
	if stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
		t.Logf("no BPF run time statistics: %v", err)
	} else {
		defer stats.Close()
	}
	type arm struct {
		name      string
		a, b      *pod
		progs     []namedProg
		gbps, p50 []float64
		p99       []float64
		bpf       []map[string]float64 // per round: hook -> ns per round trip
	}
	pa, pb := plainPair(t, 91)
	va, vb := plainVXLANPair(t, 90)
	arms := []*arm{{name: "baseline", a: pa, b: pb}, {name: "plain vxlan", a: va, b: vb}}
	net := 92
	addCluster := func(name, mode, agent string, args ...string) {
		c := newClusterAgent(t, mode, 2, net, args, agent)
		net++
		waitRoutes(t, c.nodes...)
		a, b := c.nodes[0].addPod("bench-a"), c.nodes[1].addPod("bench-b")
		arms = append(arms, &arm{name: name, a: a, b: b, progs: nodeProgs(t, c.nodes...)})
	}
	addCluster("native", "native", "")
	addCluster("tunnel", "tunnel", "")
	if os.Getenv("MEMBRANE_XNODE_NOMASQ") == "1" {
		// Without the masquerade's nftables table: no netfilter
		// conntrack in the nodes' netns (its share of the stack's cost).
		addCluster("native --masquerade=false", "native", "", "--masquerade=false")
		addCluster("tunnel --masquerade=false", "tunnel", "", "--masquerade=false")
	}
	if old := os.Getenv("MEMBRANE_XNODE_OLD_AGENT"); old != "" {
		addCluster("native "+filepath.Base(old), "native", old)
		addCluster("tunnel "+filepath.Base(old), "tunnel", old)
	}
	rounds := xnodeRounds
	if n, err := strconv.Atoi(os.Getenv("MEMBRANE_XNODE_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	for round := range rounds {
		order := slices.Clone(arms)
		order = append(order[round%len(order):], order[:round%len(order)]...)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, a := range order {
			g := throughputOnce(t, a.a, a.b, 11000+round)
			before := progStats(t, a.progs)
			p50, p99 := latencyAt(t, a.a, a.b, 9200+round)
			after := progStats(t, a.progs)
			per := map[string]float64{}
			for k, v := range after {
				per[k] = float64(v-before[k]) / benchRoundTrips
			}
			a.gbps, a.p50, a.p99, a.bpf = append(a.gbps, g), append(a.p50, float64(p50)), append(a.p99, float64(p99)), append(a.bpf, per)
			t.Logf("round %d %s: %.2f Gbit/s, RTT p50 %v p99 %v; BPF per round trip %s", round, a.name, g, p50, p99, fmtBPF(per))
		}
	}
	t.Logf("load average at end: %s", loadavg())
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	base := arms[0]
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| mode | throughput (Gbit/s, median of %d rounds) | vs baseline | RTT p50 | RTT p99 | p50 vs baseline (median of rounds' ratios) | BPF per round trip (median) |\n|---|---|---|---|---|---|---|\n", rounds)
	for _, a := range arms {
		var gr, lr []float64
		for i := range a.gbps {
			gr, lr = append(gr, a.gbps[i]/base.gbps[i]), append(lr, a.p50[i]/base.p50[i])
		}
		bpfMed := map[string]float64{}
		for k := range a.bpf[0] {
			var v []float64
			for _, r := range a.bpf {
				v = append(v, r[k])
			}
			bpfMed[k] = med(v)
		}
		fmt.Fprintf(&sb, "| %s | %.2f | %.2f | %v | %v | %.2f | %s |\n", a.name, med(a.gbps), med(gr), time.Duration(med(a.p50)),
			time.Duration(med(a.p99)), med(lr), fmtBPF(bpfMed))
	}
	t.Log(sb.String())
}

// xnodeRounds is how many times TestCrossNodeNumbers measures each arm.
const xnodeRounds = 6

// namedProg is a program attached on a node, by the hook it runs at.
type namedProg struct {
	hook string
	prog *ebpf.Program
}

// nodeProgs loads the programs the nodes' agents attached: the endpoint
// programs (<bpffs>/programs/<digest>/), in tunnel mode the overlay
// programs (their pinned links under <bpffs>/overlay/), and the uplinks'
// from_netdev (<bpffs>/netdev/<device>).
func nodeProgs(t *testing.T, nodes ...*node) []namedProg {
	t.Helper()
	var out []namedProg
	for _, nd := range nodes {
		paths, _ := filepath.Glob(filepath.Join(nd.bpffs, "programs", "*", "*"))
		for _, path := range paths {
			prog, err := ebpf.LoadPinnedProgram(path, nil)
			if err != nil {
				continue
			}
			t.Cleanup(func() { prog.Close() })
			out = append(out, namedProg{filepath.Base(path), prog})
		}
		links := map[string]string{"to_overlay": filepath.Join(nd.bpffs, "overlay", "to"),
			"from_overlay": filepath.Join(nd.bpffs, "overlay", "from")}
		devs, _ := filepath.Glob(filepath.Join(nd.bpffs, "netdev", "*"))
		for _, d := range devs {
			links["from_netdev "+filepath.Base(d)] = d
		}
		for hook, pin := range links {
			l, err := link.LoadPinnedLink(pin, nil)
			if err != nil {
				continue
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				t.Fatal(err)
			}
			prog, err := ebpf.NewProgramFromID(info.Program)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { prog.Close() })
			out = append(out, namedProg{strings.Fields(hook)[0], prog})
		}
	}
	return out
}

// progStats sums the programs' run time by hook.
func progStats(t *testing.T, ps []namedProg) map[string]time.Duration {
	t.Helper()
	out := map[string]time.Duration{}
	for _, p := range ps {
		st, err := p.prog.Stats()
		if err != nil {
			t.Fatal(err)
		}
		out[p.hook] += st.Runtime
	}
	return out
}

func fmtBPF(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := slices.Sorted(maps.Keys(m))
	var parts []string
	total := 0.0
	for _, k := range keys {
		if m[k] == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f ns", k, m[k]))
		total += m[k]
	}
	return fmt.Sprintf("%.0f ns (%s)", total, strings.Join(parts, ", "))
}

// throughputOnce streams benchBytes from a to b once, b listening on
// port, and returns Gbit/s.
func throughputOnce(t *testing.T, a, b *pod, port int) float64 {
	t.Helper()
	buf := make([]byte, 128<<10)
	done := make(chan int64, 1)
	conn := dial(t, a, b, port, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		done <- n
	})
	start := time.Now()
	for sent := 0; sent < benchBytes; sent += len(buf) {
		if _, err := conn.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	if n := <-done; n != benchBytes {
		t.Fatalf("received %d bytes, want %d", n, benchBytes)
	}
	return float64(benchBytes) * 8 / time.Since(start).Seconds() / 1e9
}

// plainVXLANPair is plainPair with the pod ranges routed through a plain
// VXLAN device on each node (VNI 42, port 8472, the other node as its
// remote, MTU 1450; no BPF, no agent): the encapsulation's own cost, the
// floor of tunnel mode.
func plainVXLANPair(t *testing.T, netNum int) (*pod, *pod) {
	t.Helper()
	c := &cluster{t: t, net: netNum, dir: t.TempDir()}
	c.makeUnderlay()
	var nodes [2]*testutil.NS
	var pods [2]*pod
	for i := range nodes {
		nodes[i] = c.attach("mbm-pvx", i, "eth0")
		if err := nodes[i].Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
			t.Fatal(err)
		}
		pods[i] = plainPod(t, nodes[i], netNum, i)
	}
	for i, nd := range nodes {
		o := 1 - i
		local, _ := c.underlayAddrs(i)
		remote, _ := c.underlayAddrs(o)
		nl := nd.Netlink(t)
		eth0, err := nl.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.MTU = "vx0", 1450
		vx := &netlink.Vxlan{LinkAttrs: attrs, VxlanId: 42, Port: 8472, Group: remote.AsSlice(), SrcAddr: local.AsSlice(),
			VtepDevIndex: eth0.Attrs().Index, Learning: false}
		if err := nl.LinkAdd(vx); err != nil {
			t.Fatal(err)
		}
		dev, err := nl.LinkByName("vx0")
		if err != nil {
			t.Fatal(err)
		}
		mine := netip.AddrFrom4([4]byte{172, 16, byte(netNum), byte(i + 1)})
		peer := netip.AddrFrom4([4]byte{172, 16, byte(netNum), byte(o + 1)})
		for _, err := range []error{
			nl.AddrAdd(dev, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(mine, 24))}),
			nl.LinkSetUp(dev),
			nl.RouteAdd(&netlink.Route{Dst: prefixNet(netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", netNum, o))), Gw: peer.AsSlice(), LinkIndex: dev.Attrs().Index}),
		} {
			if err != nil {
				t.Fatalf("plain vxlan: %v", err)
			}
		}
	}
	return pods[0], pods[1]
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// dial connects from a to b's IPv4 address on port (b listening), both
// sockets made in the pods' netns.
func dial(t *testing.T, a, b *pod, port int, serve func(net.Conn)) net.Conn {
	t.Helper()
	addr := net.JoinHostPort(b.ip4.String(), fmt.Sprint(port))
	var ln net.Listener
	if err := b.ns.Do(func() (err error) { ln, err = net.Listen("tcp", addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); serve(c) }()
		}
	}()
	var conn net.Conn
	if err := a.ns.Do(func() (err error) { conn, err = net.DialTimeout("tcp", addr, 10*time.Second); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// throughputAt streams benchBytes from a to b benchRuns times (a new
// connection each, b listening on ports from base up) and returns the
// median in Gbit/s.
func throughputAt(t *testing.T, a, b *pod, base int) float64 {
	t.Helper()
	var rates []float64
	buf := make([]byte, 128<<10)
	for run := range benchRuns {
		done := make(chan int64, 1)
		conn := dial(t, a, b, base+run, func(c net.Conn) {
			n, _ := io.Copy(io.Discard, c)
			done <- n
		})
		start := time.Now()
		for sent := 0; sent < benchBytes; sent += len(buf) {
			if _, err := conn.Write(buf); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close()
		if n := <-done; n != benchBytes {
			t.Fatalf("received %d bytes, want %d", n, benchBytes)
		}
		rates = append(rates, float64(benchBytes)*8/time.Since(start).Seconds()/1e9)
	}
	slices.Sort(rates)
	return rates[len(rates)/2]
}

// latencyAt runs benchRoundTrips 1-byte request/response exchanges on
// one connection (b listening on port) and returns the median and 99th
// percentile round trip.
func latencyAt(t *testing.T, a, b *pod, port int) (p50, p99 time.Duration) {
	t.Helper()
	conn := dial(t, a, b, port, func(c net.Conn) { _, _ = io.Copy(c, c) })
	one := []byte{1}
	rtts := make([]time.Duration, 0, benchRoundTrips)
	for range benchRoundTrips {
		start := time.Now()
		if _, err := conn.Write(one); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, one); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2], rtts[len(rtts)*99/100]
}

// plainPair makes the baseline: two node netns on an underlay bridge,
// one pod each on a plain veth (gateway address on the host side, a /32
// route to the pod), the other node's pod range routed via its address.
// No agent, no BPF, no masquerade.
func plainPair(t *testing.T, netNum int) (*pod, *pod) {
	t.Helper()
	c := &cluster{t: t, net: netNum, dir: t.TempDir()}
	c.underlay = testutil.NewNS(t, "mbm-ul")
	unl := c.underlay.Netlink(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0", MTU: underlayMTU}}
	if err := unl.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := unl.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	var nodes [2]*testutil.NS
	var pods [2]*pod
	for i := range nodes {
		nodes[i] = c.attach("mbm-plain", i, "eth0")
		if err := nodes[i].Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
			t.Fatal(err)
		}
		pods[i] = plainPod(t, nodes[i], netNum, i)
	}
	for i, nd := range nodes {
		o := 1 - i
		gw, _ := c.underlayAddrs(o)
		r := &netlink.Route{Dst: prefixNet(netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", netNum, o))), Gw: gw.AsSlice()}
		if err := nd.Netlink(t).RouteAdd(r); err != nil {
			t.Fatal(err)
		}
	}
	return pods[0], pods[1]
}

func plainPod(t *testing.T, node *testutil.NS, netNum, i int) *pod {
	t.Helper()
	p := &pod{name: fmt.Sprintf("plain-%d", i), ns: testutil.NewNS(t, "mbm-pod")}
	p.ip4 = netip.AddrFrom4([4]byte{10, byte(netNum), byte(i), 10})
	gw := netip.AddrFrom4([4]byte{10, byte(netNum), byte(i), 1})
	h, err := p.ns.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nl := node.Netlink(t)
	name := "veth" + testutil.RandomSuffix(6)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: podMTU}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))}); err != nil {
		t.Fatal(err)
	}
	host, err := nl.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	pnl := p.ns.Netlink(t)
	eth0, err := pnl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		nl.AddrAdd(host, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(gw, 32))}),
		nl.LinkSetUp(host),
		nl.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(p.ip4, 32)), Scope: netlink.SCOPE_LINK}),
		pnl.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(p.ip4, 32))}),
		pnl.LinkSetUp(eth0),
		pnl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(gw, 32)), Scope: netlink.SCOPE_LINK}),
		pnl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gw.AsSlice()}),
	} {
		if err != nil {
			t.Fatalf("plain pod: %v", err)
		}
	}
	return p
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// TestSameNodeNumbers measures TCP between two pods on one node: stream
// throughput and the request/response rate of one connection (1-byte
// request, 1-byte answer, one at a time), Membrane's (the agent's veths
// and BPF programs, native routing, no policy) against two pods on plain
// veths and routes in one node netns without BPF or agent. The arms
// alternate over sameNodeRounds rounds (each round in another order), so
// the machine's load falls on all alike. More arms, each a node of its
// own: MEMBRANE_SAMENODE_FLOWS_OFF=1 adds the agent with --flows=false,
// MEMBRANE_SAMENODE_OLD_AGENT=<path>[,<path>...] an arm with the agent
// binary at each path (an older build: old against new in one run); MEMBRANE_SAMENODE_ROUNDS=<n>
// measures n rounds instead of sameNodeRounds. Measurement, not a test:
// MEMBRANE_XNODE_BENCH=1 (make bench-xnode).
func TestSameNodeNumbers(t *testing.T) {
	if os.Getenv("MEMBRANE_XNODE_BENCH") != "1" {
		t.Skip("set MEMBRANE_XNODE_BENCH=1 to measure (BENCHMARKS.md)")
	}
	testutil.RequireRoot(t)
	t.Logf("load average at start: %s", loadavg())
	type arm struct {
		name       string
		a, b       *pod
		gbps, rrps []float64
		progs      endpointProgs
		// bpf: the endpoint programs' run time per transaction of
		// each round's request/response run (BPF_ENABLE_STATS);
		// hooks: the same by program (from_container, to_container).
		bpf   []float64
		hooks map[string][]float64
	}
	if stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
		t.Logf("no BPF run time statistics: %v", err)
	} else {
		defer stats.Close()
	}
	pa, pb := plainSameNode(t, 93)
	c := newCluster(t, "native", 1, 94)
	arms := []*arm{{name: "plain veth + routes", a: pa, b: pb},
		{name: "Membrane", a: c.nodes[0].addPod("same-a"), b: c.nodes[0].addPod("same-b")}}
	if os.Getenv("MEMBRANE_SAMENODE_FLOWS_OFF") == "1" {
		c := newClusterWith(t, "native", 1, 95, []string{"--flows=false"})
		arms = append(arms, &arm{name: "Membrane --flows=false", a: c.nodes[0].addPod("same-a"), b: c.nodes[0].addPod("same-b")})
	}
	for i, old := range strings.FieldsFunc(os.Getenv("MEMBRANE_SAMENODE_OLD_AGENT"), func(r rune) bool { return r == ',' }) {
		c := newClusterAgent(t, "native", 1, 96+i, nil, old)
		arms = append(arms, &arm{name: "Membrane " + filepath.Base(old), a: c.nodes[0].addPod("same-a"), b: c.nodes[0].addPod("same-b")})
	}
	rounds := sameNodeRounds
	if n, err := strconv.Atoi(os.Getenv("MEMBRANE_SAMENODE_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	for round := range rounds {
		order := slices.Clone(arms)
		// Rotate by the round and reverse every other round: each arm
		// runs first, last and next to each other arm.
		order = append(order[round%len(order):], order[:round%len(order)]...)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, a := range order {
			if round == 0 && a.a.node != nil {
				a.progs = hostProgs(t, a.a, a.b)
				t.Logf("%s: %d endpoint programs", a.name, len(a.progs))
			}
			g := throughputAt(t, a.a, a.b, 10000+10*round)
			run0, n0 := a.progs.stats(t)
			hook0 := progStats(t, a.progs)
			r := rrRate(t, a.a, a.b, 9300+round)
			run1, n1 := a.progs.stats(t)
			hook1 := progStats(t, a.progs)
			a.gbps, a.rrps = append(a.gbps, g), append(a.rrps, r)
			per := map[string]float64{}
			if a.progs != nil {
				a.bpf = append(a.bpf, float64(run1-run0)/benchRoundTrips)
				if a.hooks == nil {
					a.hooks = map[string][]float64{}
				}
				for h, d := range hook1 {
					per[h] = float64(d-hook0[h]) / benchRoundTrips
					a.hooks[h] = append(a.hooks[h], per[h])
				}
			}
			t.Logf("round %d %s: %.2f Gbit/s, %.0f transactions/s; endpoint programs %d runs, per transaction %s", round, a.name, g, r,
				n1-n0, fmtBPF(per))
		}
	}
	t.Logf("load average at end: %s", loadavg())
	med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
	base := arms[0]
	for _, m := range arms[1:] {
		// Each round's ratio to the plain arm's next to it: the load
		// drifts less within a round than across the run.
		var sr, rr []float64
		for i := range m.gbps {
			sr, rr = append(sr, m.gbps[i]/base.gbps[i]), append(rr, m.rrps[i]/base.rrps[i])
		}
		if len(m.bpf) > 0 {
			hm := map[string]float64{}
			for h, v := range m.hooks {
				hm[h] = med(v)
			}
			t.Logf("SUMMARY %s: endpoint programs' run time per transaction, median %.0f ns; by program, medians %s", m.name, med(m.bpf), fmtBPF(hm))
		}
		t.Logf("SUMMARY same-node, median of the rounds' ratios: %s / plain: stream %.2f; request/response %.2f", m.name, med(sr), med(rr))
		t.Logf("SUMMARY same-node stream, median of %d rounds: %s %.2f vs plain %.2f Gbit/s = %.2f; request/response: %s %.0f vs plain %.0f transactions/s = %.2f",
			rounds, m.name, med(m.gbps), med(base.gbps), med(m.gbps)/med(base.gbps), m.name, med(m.rrps), med(base.rrps), med(m.rrps)/med(base.rrps))
	}
}

// sameNodeRounds is how many times TestSameNodeNumbers measures each arm.
const sameNodeRounds = 6

// rrRate is the request/response rate of one connection from a to b:
// benchRoundTrips 1-byte requests, each answered before the next.
func rrRate(t *testing.T, a, b *pod, port int) float64 {
	t.Helper()
	conn := dial(t, a, b, port, func(c net.Conn) { _, _ = io.Copy(c, c) })
	one := []byte{1}
	start := time.Now()
	for range benchRoundTrips {
		if _, err := conn.Write(one); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, one); err != nil {
			t.Fatal(err)
		}
	}
	return float64(benchRoundTrips) / time.Since(start).Seconds()
}

// plainSameNode makes the same-node baseline: one node netns (forwarding
// on) with two pods on plain veths (gateway address on the host side, a
// /32 route to each pod). No agent, no BPF.
func plainSameNode(t *testing.T, netNum int) (*pod, *pod) {
	t.Helper()
	node := testutil.NewNS(t, "mbm-plain1")
	if err := node.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	return plainPod(t, node, netNum, 0), plainPod(t, node, netNum, 1)
}

// endpointProgs are the endpoint programs attached to pods' host veths.
// The per-hook sums are progStats' (the hooks: from_container,
// to_container).
type endpointProgs []namedProg

// hostProgs loads the endpoint programs of the pods' nodes from the
// agents' pins (<bpffs>/programs/<digest>/{from,to}_container).
func hostProgs(t *testing.T, pods ...*pod) endpointProgs {
	t.Helper()
	var progs endpointProgs
	seen := map[string]bool{}
	for _, p := range pods {
		for _, name := range []string{"from_container", "to_container"} {
			paths, _ := filepath.Glob(filepath.Join(p.node.bpffs, "programs", "*", name))
			for _, path := range paths {
				if seen[path] {
					continue
				}
				seen[path] = true
				prog, err := ebpf.LoadPinnedProgram(path, nil)
				if err != nil {
					t.Fatalf("endpoint program: %v", err)
				}
				t.Cleanup(func() { prog.Close() })
				progs = append(progs, namedProg{name, prog})
			}
		}
	}
	return progs
}

// stats sums the programs' run time and runs so far.
func (ps endpointProgs) stats(t *testing.T) (time.Duration, uint64) {
	t.Helper()
	var run time.Duration
	var n uint64
	for _, p := range ps {
		st, err := p.prog.Stats()
		if err != nil {
			t.Fatal(err)
		}
		run, n = run+st.Runtime, n+st.RunCount
	}
	return run, n
}
