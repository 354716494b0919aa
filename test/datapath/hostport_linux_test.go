package datapath_test

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// hostPortMappings are a pod's hostPorts as a runtime passes them.
func hostPortMappings(tcp, udp int) map[string]any {
	return map[string]any{"portMappings": []map[string]any{
		{"hostPort": tcp, "containerPort": 8080, "protocol": "tcp"},
		{"hostPort": udp, "containerPort": 8080, "protocol": "udp"}}}
}

// askName asks the name server behind addr:port over proto from ns
// (one line over TCP, one datagram over UDP) and returns the answer.
func askName(ns *testutil.NS, proto string, addr netip.Addr, port int, timeout time.Duration) (string, error) {
	var got string
	err := ns.Do(func() error {
		c, err := net.DialTimeout(proto, netip.AddrPortFrom(addr, uint16(port)).String(), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte("who\n")); err != nil {
			return err
		}
		if proto == "udp" {
			buf := make([]byte, 64)
			n, err := c.Read(buf)
			got = string(buf[:n])
			return err
		}
		got, err = bufio.NewReader(c).ReadString('\n')
		got = strings.TrimSpace(got)
		return err
	})
	return got, err
}

// TestHostPortBPF is issue #35's hostPort item in kube-proxy
// replacement mode: membrane-cni declares the portMappings capability,
// the agent programs each mapping as HostPort services on the node's
// addresses (whose backend is the pod) in the BPF service maps. From
// beyond the node, nodeIP:hostPort reaches the pod over TCP and UDP,
// IPv4 and IPv6; a second pod asking for the same hostPort is refused
// with a clear error; an agent restart keeps the mapping; DEL removes it.
func TestHostPortBPF(t *testing.T) {
	e := newEnvStack(t, "10.237.0.0/24", "fd00:237::/120")
	far := farNetns(t, e.NS) // before the agent: its link is an uplink
	cg := testutil.Cgroup2Dir(t)
	kpr := func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
	}
	startAgent(e, kpr)
	e.Conf = e.Chain("1.0.0", nil, `"capabilities":{"portMappings":true}`, nil)
	p := e.NewPod("web")
	p.RT.CapabilityArgs = hostPortMappings(18080, 18053)
	e.MustAdd(p)
	e.DelAtCleanup(p)
	pp := &policyPod{Pod: p, ips: []netip.Addr{p.IPv4, p.IPv6}}
	pp.nameServer(t, 8080)
	nodes := []netip.Addr{netip.MustParseAddr("10.237.9.1"), netip.MustParseAddr("fd00:237:9::1")}
	reach := func(what string) {
		t.Helper()
		for _, node := range nodes {
			for _, f := range []struct {
				proto string
				port  int
			}{{"tcp", 18080}, {"udp", 18053}} {
				if got, err := askName(far.NS, f.proto, node, f.port, 5*time.Second); err != nil || got != "web" {
					t.Errorf("%s: far -> [%s]:%d/%s = %q, %v; want the pod's answer", what, node, f.port, f.proto, got, err)
				}
			}
		}
	}
	reach("after ADD")

	q := e.NewPod("web2")
	q.RT.CapabilityArgs = hostPortMappings(18080, 18054)
	if _, err := e.Add(q); err == nil || !strings.Contains(err.Error(), "taken by endpoint") {
		t.Errorf("ADD of a second pod on hostPort 18080: %v; want it refused as taken", err)
	} else {
		t.Logf("second pod on the same hostPort: %v", err)
	}
	if err := e.Del(q); err != nil {
		t.Errorf("DEL after the refused ADD: %v", err)
	}

	e.StopAgent()
	startAgent(e, kpr)
	reach("after an agent restart")

	if err := e.Del(p); err != nil {
		t.Fatal(err)
	}
	for _, node := range nodes {
		if got, err := askName(far.NS, "tcp", node, 18080, deniedDial); err == nil {
			t.Errorf("far -> [%s]:18080 answered %q after DEL", node, got)
		}
	}
	c := e.Client()
	svcs, err := c.Services(t.Context(), false)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Services {
		if s.Kind == "HostPort" {
			t.Errorf("HostPort service left after DEL: %+v", s)
		}
	}
}

// TestHostPortGoneWithGC: the HostPort services of a pod whose endpoint
// goes without a DEL (its netns vanished; the garbage collector deletes
// the endpoint) go with the periodic resync.
func TestHostPortGoneWithGC(t *testing.T) {
	e := newEnvStack(t, "10.237.1.0/24", "fd00:237:1::/120")
	farNetns(t, e.NS) // before the agent: its link is the uplink
	cg := testutil.Cgroup2Dir(t)
	startAgent(e, func(c *agent.Config) {
		c.Linux.Services.KubeProxyReplacement, c.Linux.Services.Cgroup = true, cg
		c.HostPortSyncInterval = 200 * time.Millisecond
	})
	e.Conf = e.Chain("1.0.0", nil, `"capabilities":{"portMappings":true}`, nil)
	p := e.NewPod("gone")
	p.RT.CapabilityArgs = hostPortMappings(18081, 18055)
	e.MustAdd(p)
	e.DelAtCleanup(p)
	c := e.Client()
	hostPorts := func() int {
		svcs, err := c.Services(t.Context(), false)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, s := range svcs.Services {
			if s.Kind == "HostPort" {
				n++
			}
		}
		return n
	}
	if hostPorts() == 0 {
		t.Fatal("no HostPort service after ADD")
	}
	if err := p.NS.Remove(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the endpoint deleted by the collector", func() bool {
		_, err := c.EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID)
		return err != nil
	})
	testutil.Eventually(t, "its HostPort services gone", func() bool { return hostPorts() == 0 })
}
