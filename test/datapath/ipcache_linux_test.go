package datapath_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/policyscenario"
)

// TestIPCacheStaleEntryPrunedAtStart: the kernel ipcache is pinned and
// outlives the agent; an entry left for an endpoint deleted while no
// agent ran is gone once the agent is back, while the restored pod's
// entry stays.
func TestIPCacheStaleEntryPrunedAtStart(t *testing.T) {
	e := newEnv(t, "10.231.4.0/24")
	startAgent(e, nil)
	c := e.Client()
	p := e.NewPod("kept")
	res := e.MustAdd(p)
	ip, _ := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	ep, err := c.EndpointGet(context.Background(), "container-id:"+p.RT.ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	kept := netip.PrefixFrom(ip, 32)
	// The ipcache actor writes the pod's entry after the ADD answered; a
	// stop does not wait for it, so wait here.
	running := e.Agent.System.Datapath.(*datapath.Linux)
	testutil.Eventually(t, "the pod's ipcache entry in the pinned map", func() bool {
		held, err := running.DumpIPCache(context.Background())
		return err == nil && held[kept] == identity.NumericIdentity(ep.Identity.ID)
	})
	e.StopAgent()

	// While no agent runs, something (here a second datapath on the same
	// pins, as a previous agent would have) leaves an entry behind.
	stale := netip.MustParsePrefix("10.231.4.200/32")
	l, err := datapath.NewLinux(datapath.LinuxConfig{HostNetns: e.NS.Path, BPFFS: e.BPFFS}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.UpsertIPCache(context.Background(), stale, 4242, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	held, err := l.DumpIPCache(context.Background())
	_ = l.Close()
	if err != nil || held[stale] != 4242 || held[kept] != identity.NumericIdentity(ep.Identity.ID) {
		t.Fatalf("pinned ipcache before the restart = %v, %v; want %s and %s", held, err, stale, kept)
	}

	startAgent(e, nil)
	linux := e.Agent.System.Datapath.(*datapath.Linux)
	testutil.Eventually(t, "the stale ipcache entry to go", func() bool {
		got, err := linux.DumpIPCache(context.Background())
		_, left := got[stale]
		return err == nil && !left
	})
	got, err := linux.DumpIPCache(context.Background())
	if err != nil || got[kept] != identity.NumericIdentity(ep.Identity.ID) {
		t.Fatalf("ipcache after the restart = %v, %v; want %s -> %d kept", got, err, kept, ep.Identity.ID)
	}
}

// cnpFromHost lets the host (entity host) into app=h on TCP 8080.
const cnpFromHost = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: from-host, namespace: default}
spec:
  endpointSelector:
    matchLabels: {app: h}
  ingress:
  - fromEntities: [host]
    toPorts: [{ports: [{port: "8080", protocol: TCP}]}]
`

// TestHostAddressesAreHost: a connection the host opens to a pod from
// one of its own addresses (not a gateway: a node IP, as kubelet probes
// use) is the host identity, so a policy admitting only the host entity
// lets it in; the address is in the kernel ipcache as host.
func TestHostAddressesAreHost(t *testing.T) {
	e := newEnv(t, "10.231.5.0/24")
	nodeIP := netip.MustParseAddr("192.0.2.10")
	hnl := e.NS.Netlink(t)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = "mbtnode0"
	// A veth (both ends in the host netns) stands in for the node's NIC.
	if err := hnl.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "mbtnode1"}); err != nil {
		t.Fatal(err)
	}
	dummy, err := hnl.LinkByName(attrs.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(hnl.AddrAdd(dummy, &netlink.Addr{IPNet: &net.IPNet{IP: nodeIP.AsSlice(), Mask: net.CIDRMask(24, 32)}}),
		hnl.LinkSetUp(dummy)); err != nil {
		t.Fatal(err)
	}
	startAgent(e, nil)
	c := e.Client()
	h := addPolicyPod(t, e, c, "pod-h", "k8s:app=h")
	h.listen(t, 8080)
	got, err := e.Agent.System.Datapath.(*datapath.Linux).DumpIPCache(context.Background())
	if err != nil || got[netip.PrefixFrom(nodeIP, 32)] != identity.ReservedHost {
		t.Fatalf("kernel ipcache = %v, %v; want %s as host", got, err, nodeIP)
	}
	if _, err := c.PolicyImport(context.Background(), []byte(cnpFromHost), client.ContentTypeYAML); err != nil {
		t.Fatal(err)
	}
	policyscenario.WaitRealized(t, c, h.ep.ID, "the host allowed into H on 8080", func(m *policy.MapState) bool {
		return m.Enforced(policy.Ingress) && m.Allows(identity.ReservedHost, 8080, policy.ProtoTCP, policy.Ingress)
	})
	err = e.NS.Do(func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: nodeIP.AsSlice()}}
		conn, err := d.Dial("tcp", net.JoinHostPort(h.ips[0].String(), "8080"))
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := conn.Write([]byte("probe")); err != nil {
			return err
		}
		_, err = io.ReadFull(conn, make([]byte, 5))
		return err
	})
	if err != nil {
		t.Fatalf("host (%s) -> H:8080 with only the host admitted: %v", nodeIP, err)
	}
}
