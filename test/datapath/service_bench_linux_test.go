package datapath_test

import (
	"context"

	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// TestServiceBenchmark measures connection setup and throughput to a
// ClusterIP through Membrane's BPF translation against the same through
// kube-proxy-style iptables DNAT rules (nat PREROUTING in the host
// netns, KUBE-SERVICES/KUBE-SVC/KUBE-SEP chains with statistic-mode
// random), same pods, same run, interleaved. Numbers in BENCHMARKS.md
// ("Services (issue 19)"). Runs only with MEMBRANE_BENCH_SERVICES=1:
//
//	MEMBRANE_BENCH_SERVICES=1 go test -count=1 -v -run TestServiceBenchmark ./pkg/clients/cni/
func TestServiceBenchmark(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_SERVICES") == "" {
		t.Skip("a benchmark: set MEMBRANE_BENCH_SERVICES=1")
	}
	e := newEnvStack(t, "10.234.0.0/24", "")
	startAgent(e, nil)
	c := e.Client()
	cl := addPolicyPod(t, e, c, "client", "k8s:app=client")
	b1 := addPolicyPod(t, e, c, "db-1", "k8s:app=db")
	b2 := addPolicyPod(t, e, c, "db-2", "k8s:app=db")
	for _, b := range []*policyPod{b1, b2} {
		b.sinkServer(t, 8080)
	}
	bpfVIP, iptVIP := netip.MustParseAddr("10.96.34.10"), netip.MustParseAddr("10.96.34.20")
	if _, err := e.Agent.System.UpsertService(context.Background(), "bench", svcOf("db", bpfVIP, 80, service.TCP, b1, b2)); err != nil {
		t.Fatal(err)
	}
	kubeProxyRules(t, e, iptVIP, 80, b1.ip(iptVIP), b2.ip(iptVIP))
	const rounds, perRound = 5, 400
	lat := map[string][]time.Duration{}
	tput := map[string][]float64{}
	for range rounds {
		for _, m := range []struct {
			name string
			vip  netip.Addr
		}{{"membrane-bpf", bpfVIP}, {"iptables-dnat", iptVIP}} {
			lat[m.name] = append(lat[m.name], cl.connectTimes(t, m.vip, 80, perRound)...)
			tput[m.name] = append(tput[m.name], cl.throughput(t, m.vip, 80, 256<<20))
		}
	}
	for _, name := range []string{"membrane-bpf", "iptables-dnat"} {
		d := lat[name]
		slices.Sort(d)
		t.Logf("%-14s connect+1B echo: n=%d p50=%v p99=%v; throughput median %.0f MB/s", name, len(d),
			d[len(d)/2], d[len(d)*99/100], median(tput[name]))
	}
	bp, ip := lat["membrane-bpf"], lat["iptables-dnat"]
	t.Logf("ratio membrane/iptables: p50 %.2f, p99 %.2f, throughput %.2f",
		float64(bp[len(bp)/2])/float64(ip[len(ip)/2]), float64(bp[len(bp)*99/100])/float64(ip[len(ip)*99/100]),
		median(tput["membrane-bpf"])/median(tput["iptables-dnat"]))
	t.Logf("load average: %s", loadavg())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return string(b)
}

// kubeProxyRules installs kube-proxy's iptables shape for vip:port over
// two backends (port 8080) in the host netns; removed with the netns.
func kubeProxyRules(t *testing.T, e *nodeharness.Node, vip netip.Addr, port int, b1, b2 netip.Addr) {
	t.Helper()
	ipt := testutil.RequireTool(t, "iptables")
	dst := vip.String()
	for _, args := range [][]string{
		{"-t", "nat", "-N", "KUBE-SERVICES"},
		{"-t", "nat", "-N", "KUBE-SVC-BENCH"},
		{"-t", "nat", "-N", "KUBE-SEP-1"},
		{"-t", "nat", "-N", "KUBE-SEP-2"},
		{"-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"},
		{"-t", "nat", "-A", "KUBE-SERVICES", "-d", dst + "/32", "-p", "tcp", "--dport", strconv.Itoa(port), "-j", "KUBE-SVC-BENCH"},
		{"-t", "nat", "-A", "KUBE-SVC-BENCH", "-m", "statistic", "--mode", "random", "--probability", "0.5", "-j", "KUBE-SEP-1"},
		{"-t", "nat", "-A", "KUBE-SVC-BENCH", "-j", "KUBE-SEP-2"},
		{"-t", "nat", "-A", "KUBE-SEP-1", "-p", "tcp", "-j", "DNAT", "--to-destination", b1.String() + ":8080"},
		{"-t", "nat", "-A", "KUBE-SEP-2", "-p", "tcp", "-j", "DNAT", "--to-destination", b2.String() + ":8080"},
	} {
		if out, err := e.NS.Exec(ipt, args...); err != nil {
			t.Fatalf("iptables %v: %v: %s", args, err, out)
		}
	}
}

// sinkServer answers each connection's first byte with one byte, then
// reads (and drops) everything until EOF.
func (p *policyPod) sinkServer(t *testing.T, port int) {
	t.Helper()
	for _, ip := range p.ips {
		var ln net.Listener
		if err := p.NS.Do(func() (err error) {
			ln, err = net.Listen("tcp", net.JoinHostPort(ip.String(), strconv.Itoa(port)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					b := make([]byte, 1)
					if _, err := io.ReadFull(c, b); err != nil {
						return
					}
					if _, err := c.Write(b); err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, c)
				}()
			}
		}()
	}
}

// connectTimes times n sequential connection setups with a one-byte
// exchange (the first packet's translation and its reply's).
func (p *policyPod) connectTimes(t *testing.T, vip netip.Addr, port, n int) []time.Duration {
	t.Helper()
	out := make([]time.Duration, 0, n)
	err := p.NS.Do(func() error {
		addr := net.JoinHostPort(vip.String(), strconv.Itoa(port))
		b := []byte{1}
		for range n {
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				return err
			}
			_, err = c.Write(b)
			if err == nil {
				_, err = io.ReadFull(c, b)
			}
			out = append(out, time.Since(start))
			c.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("connect to %s: %v", vip, err)
	}
	return out
}

// throughput sends size bytes over one connection and returns MB/s.
func (p *policyPod) throughput(t *testing.T, vip netip.Addr, port, size int) float64 {
	t.Helper()
	var mbps float64
	err := p.NS.Do(func() error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(vip.String(), strconv.Itoa(port)), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		b := []byte{1}
		if _, err := c.Write(b); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, b); err != nil {
			return err
		}
		buf := make([]byte, 256<<10)
		start := time.Now()
		for sent := 0; sent < size; sent += len(buf) {
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		mbps = float64(size) / 1e6 / time.Since(start).Seconds()
		return nil
	})
	if err != nil {
		t.Fatalf("throughput to %s: %v", vip, err)
	}
	return mbps
}
