package l7

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

func quantile(d []time.Duration, p float64) time.Duration {
	return d[min(len(d)-1, int(p*float64(len(d))))]
}

func report(t *testing.T, line string) {
	t.Log(line)
	fmt.Println(line)
}

// gets sends n GETs of path from p to dst:80 over one kept-alive
// connection and returns their latencies.
func gets(t *testing.T, p, dst *pod, path string, n int) []time.Duration {
	return getsPort(t, p, dst, 80, path, n)
}

// getsPort is gets to dst:port.
func getsPort(t *testing.T, p, dst *pod, port uint16, path string, n int) []time.Duration {
	t.Helper()
	c := p.client(okTimeout, true)
	defer c.CloseIdleConnections()
	url := "http://" + netip.AddrPortFrom(dst.ip, port).String() + path
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// throughput sends total GETs from conc kept-alive clients of p and
// returns requests per second.
func throughput(t *testing.T, p, dst *pod, conc, total int) float64 {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := p.client(okTimeout, true)
			defer c.CloseIdleConnections()
			for range total / conc {
				resp, err := c.Get("http://" + netip.AddrPortFrom(dst.ip, 80).String() + "/public")
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return float64(total/conc*conc) / time.Since(start).Seconds()
}

// TestBenchHTTPLatency (make bench-l7-http): A's GET /public to B:80
// over a kept-alive connection, through the transparent proxy (B's L7
// ingress rule) and without L7 policy (the same rule without HTTP
// rules), alternating BENCH_ROUNDS rounds of BENCH_N requests in one
// run; then requests/s from BENCH_CONC clients both ways.
func TestBenchHTTPLatency(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_L7") == "" {
		t.Skip("set MEMBRANE_BENCH_L7=1 (make bench-l7-http) to run the L7 benchmark")
	}
	rounds, n, conc := envInt("BENCH_ROUNDS", 5), envInt("BENCH_N", 400), envInt("BENCH_CONC", 8)
	nd := newNode(t, "10.244.76.0/24", nodeOpts{pods: []string{"a", "b"}, noEvents: true})
	a, b := nd.pods["a"], nd.pods["b"]
	httpServer(t, b)
	relay(t, b, relayPort, netip.AddrPortFrom(b.ip, 80))
	var plain, relayed, proxied []time.Duration
	var rpsPlain, rpsProxy float64
	for r := range rounds {
		nd.importPolicy(ingressL4Relay)
		testutil.Eventually(t, "L4 policy realised", func() bool { return !nd.hasL7(b) })
		plain = append(plain, gets(t, a, b, "/public", n)...)
		relayed = append(relayed, getsPort(t, a, b, relayPort, "/public", n)...)
		if r == 0 {
			rpsPlain = throughput(t, a, b, conc, 20*n)
		}
		nd.importPolicy(ingressPolicy)
		nd.l7Acked(b)
		proxied = append(proxied, gets(t, a, b, "/public", n)...)
		if r == 0 {
			rpsProxy = throughput(t, a, b, conc, 20*n)
		}
	}
	slices.Sort(plain)
	slices.Sort(relayed)
	slices.Sort(proxied)
	p50, p99 := func(d []time.Duration) time.Duration { return quantile(d, 0.5) }, func(d []time.Duration) time.Duration { return quantile(d, 0.99) }
	report(t, fmt.Sprintf("HTTP GET A->B:80 kept-alive, n=%d each: without L7 p50 %v p99 %v; through the proxy p50 %v p99 %v; ratio p50 %.2fx p99 %.2fx",
		len(plain), p50(plain).Round(time.Microsecond), p99(plain).Round(time.Microsecond), p50(proxied).Round(time.Microsecond),
		p99(proxied).Round(time.Microsecond), float64(p50(proxied))/float64(p50(plain)), float64(p99(proxied))/float64(p99(plain))))
	report(t, fmt.Sprintf("the floor, one extra socket hop each way (a bare relay process, io.Copy/splice, in B's netns): p50 %v p99 %v; ratio p50 %.2fx p99 %.2fx; the proxy / the relay p50 %.2fx",
		p50(relayed).Round(time.Microsecond), p99(relayed).Round(time.Microsecond), float64(p50(relayed))/float64(p50(plain)),
		float64(p99(relayed))/float64(p99(plain)), float64(p50(proxied))/float64(p50(relayed))))
	report(t, fmt.Sprintf("requests/s, %d kept-alive clients, %d requests: without L7 %.0f, through the proxy %.0f (%.2fx)",
		conc, 20*n, rpsPlain, rpsProxy, rpsProxy/rpsPlain))
}

// relayPort is where relay listens in B's netns for the floor arm.
const relayPort = 8080

// ingressL4Relay is ingressL4 with the relay's port too.
const ingressL4Relay = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: b-http, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}, {port: "8080", protocol: TCP}]
`

// relay runs a bare relay as a process of its own in p's netns (this
// test binary again, relayMain), as the proxy is one: it listens on p's
// address and port and copies each connection to and from dst. One
// extra socket hop each way and a process to wake, nothing else
// (io.Copy between TCP connections splices).
func relay(t *testing.T, p *pod, port uint16, dst netip.AddrPort) {
	t.Helper()
	listen := netip.AddrPortFrom(p.ip, port)
	cmd := exec.Command("nsenter", "--net="+p.ns.Path, os.Args[0])
	cmd.Env = append(os.Environ(), relayEnv+"="+listen.String()+">"+dst.String())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testutil.Eventually(t, "the relay listening", func() bool {
		var c net.Conn
		err := p.ns.Do(func() (err error) {
			c, err = net.DialTimeout("tcp", listen.String(), time.Second)
			return err
		})
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// relayEnv makes the test binary run relayMain ("listen>dst").
const relayEnv = "MEMBRANE_L7_BENCH_RELAY"

// relayMain is the relay process: it never returns, and exits once the
// test that started it is gone (no Pdeathsig: it follows the thread that
// started the process, and the netns helpers end their threads).
func relayMain(spec string) {
	parent := os.Getppid()
	go func() {
		for range time.Tick(time.Second) {
			if os.Getppid() != parent {
				os.Exit(0)
			}
		}
	}()
	listen, dst, _ := strings.Cut(spec, ">")
	l, err := net.Listen("tcp", listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", dst)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { _, _ = io.Copy(up, c); _ = up.(*net.TCPConn).CloseWrite() }()
			_, _ = io.Copy(c, up)
		}()
	}
}

// hasL7 reports whether p's policy view has computed L7 entries or a
// redirected realised entry.
func (n *node) hasL7(p *pod) bool {
	v, err := n.c.EndpointPolicy(context.Background(), fmt.Sprint(p.ep.ID))
	if err != nil || len(v.ComputedL7) != 0 {
		return true
	}
	return slices.ContainsFunc(v.Realized, func(e models.RealizedPolicyEntry) bool { return e.ProxyPort != 0 })
}

// benchL7Doc is an L7 policy on every benchmark endpoint's port 80; a
// changed path changes every endpoint's L7 configuration.
func benchL7Doc(round int) []byte {
	return fmt.Appendf(nil, `{"apiVersion":"cilium.io/v2","kind":"CiliumNetworkPolicy",
"metadata":{"name":"bench-l7","namespace":"default"},
"spec":{"endpointSelector":{"matchLabels":{"app":"bench"}},
"ingress":[{"toPorts":[{"ports":[{"port":"80","protocol":"TCP"}],"rules":{"http":[{"method":"GET","path":"/v%d"}]}}]}]}}`, round)
}

// TestBenchImportToAck (make bench-l7-ack): BENCH_ENDPOINTS endpoints
// (default 200) on host veths with their BPF programs; BENCH_ROUNDS
// times, an L7 policy change selecting all of them is imported; for each
// endpoint, the time from the import until its regeneration, which
// waits for the proxy's acknowledgement of its configuration, made it
// ready (its endpoint-state-changed event).
func TestBenchImportToAck(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_L7") == "" {
		t.Skip("set MEMBRANE_BENCH_L7=1 (make bench-l7-ack) to run the L7 benchmark")
	}
	count, rounds := envInt("BENCH_ENDPOINTS", 200), envInt("BENCH_ROUNDS", 5)
	nd := newNode(t, "10.232.16.0/20", nodeOpts{pods: []string{}, proxyWait: time.Minute})
	nl := nd.node.NS.Netlink(t)
	ids := map[uint16]bool{}
	for i := range count {
		ids[uint16(nd.benchEndpoint(nl, i))] = true
	}
	var all, lastOf []time.Duration
	for r := range rounds {
		nd.mu.Lock()
		seen := len(nd.events)
		nd.mu.Unlock()
		start := time.Now()
		if _, err := nd.c.PolicyImport(context.Background(), benchL7Doc(r), "application/json"); err != nil {
			t.Fatal(err)
		}
		got := map[uint16]time.Duration{}
		testutil.Eventually(t, fmt.Sprintf("round %d: %d endpoints ready after the proxy's acknowledgement", r, count), func() bool {
			nd.mu.Lock()
			defer nd.mu.Unlock()
			for _, ev := range nd.events[seen:] {
				if ev.Type == events.EndpointStateChanged && ev.State == "ready" && ids[ev.Endpoint] {
					if _, ok := got[ev.Endpoint]; !ok {
						got[ev.Endpoint] = ev.Time.Sub(start)
					}
				}
			}
			seen = len(nd.events)
			return len(got) == count
		})
		var last time.Duration
		for _, d := range got {
			all = append(all, d)
			last = max(last, d)
		}
		lastOf = append(lastOf, last)
	}
	if st := nd.proxyRow().L7Proxy; st.Pending != 0 || len(st.Endpoints) != count {
		t.Errorf("proxy after the rounds: %d pending, %d endpoints listed, want 0 and %d", st.Pending, len(st.Endpoints), count)
	}
	slices.Sort(all)
	slices.Sort(lastOf)
	report(t, fmt.Sprintf("PUT /v1/policy (L7) until each of %d endpoints is ready with the proxy's ACK, %d rounds: p50 %v p99 %v; until all: median %v max %v",
		count, rounds, quantile(all, 0.5).Round(10*time.Microsecond), quantile(all, 0.99).Round(10*time.Microsecond),
		quantile(lastOf, 0.5).Round(10*time.Microsecond), lastOf[len(lastOf)-1].Round(10*time.Microsecond)))
}

// benchEndpoint creates endpoint i on a host veth through the API
// (labels app=bench) and returns its ID.
func (n *node) benchEndpoint(nl *netlink.Handle, i int) int64 {
	n.t.Helper()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = fmt.Sprintf("lxcl7b%d", i)
	if err := nl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: fmt.Sprintf("pl7b%d", i)}); err != nil {
		n.t.Fatalf("veth %s: %v", attrs.Name, err)
	}
	link, err := nl.LinkByName(attrs.Name)
	if err != nil {
		n.t.Fatal(err)
	}
	if err := nl.LinkSetUp(link); err != nil {
		n.t.Fatal(err)
	}
	name := fmt.Sprintf("bench-%d", i)
	ctx := context.Background()
	ip, err := n.c.IPAMAllocate(ctx, "ipv4", "default/"+name)
	if err != nil {
		n.t.Fatal(err)
	}
	ep, err := n.c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: fmt.Sprintf("ctr-l7-%d", i), K8sNamespace: "default",
		K8sPodName: name, Labels: []string{"k8s:io.kubernetes.pod.namespace=default", "k8s:app=bench"},
		Addressing: &models.AddressPair{IPv4: ip.IPv4.IP}, InterfaceName: attrs.Name, InterfaceIndex: int64(link.Attrs().Index), SyncBuild: true})
	if err != nil {
		n.t.Fatalf("create endpoint %s: %v", name, err)
	}
	return ep.ID
}
