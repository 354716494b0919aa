package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/service"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestBPFNetdevDeliverOnly: from_netdev attached for native routing's
// direct delivery alone (no kube-proxy replacement, no host firewall:
// kube-proxy is in charge of NodePorts) leaves a SYN to an external
// frontend untranslated (TC_ACT_OK, the frame as it came) under
// node_config's NETDEV_F_DELIVER_ONLY; without the flag it translates
// it to the backend (BPF_PROG_TEST_RUN).
func TestBPFNetdevDeliverOnly(t *testing.T) {
	testutil.RequireRoot(t)
	b, err := openBPF(LinuxConfig{BPFFS: testutil.BPFFSDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	progs, err := loadNetdev(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(progs.close)
	fe := netip.MustParseAddrPort("192.168.95.1:30080")
	be := netip.MustParseAddrPort("10.244.62.130:8080")
	s := LBService{ID: 7, External: true, Frontend: service.Frontend{Addr: fe.Addr(), Port: fe.Port(), Proto: service.TCP},
		Backends: []service.Backend{{Addr: be.Addr(), Port: be.Port()}}}
	if err := writeLBService(&b.maps.lb, s, 0); err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort("192.168.95.2:40000")
	run := func() (uint32, parsedFrame) {
		t.Helper()
		out := make([]byte, 256)
		opts := &ebpf.RunOptions{Data: lbFrame(client, fe, service.TCP), DataOut: out}
		ret, err := progs.from.Run(opts)
		if err != nil {
			t.Fatal(err)
		}
		return ret, checkFrame(t, opts.DataOut, service.TCP)
	}
	if err := setNetdevServices(b, false); err != nil {
		t.Fatal(err)
	}
	var v bpf.EndpointNodeConfigValue
	if err := b.maps.config.Lookup(uint32(0), &v); err != nil || v.NetdevFlags != netdevFlagDeliverOnly {
		t.Fatalf("node_config netdev_flags %#x (%v), want %#x", v.NetdevFlags, err, netdevFlagDeliverOnly)
	}
	if ret, got := run(); ret != 0 || got.src != client || got.dst != fe {
		t.Fatalf("deliver only: verdict %d, %s -> %s; want 0 (TC_ACT_OK), %s -> %s untouched", ret, got.src, got.dst, client, fe)
	}
	if err := setNetdevServices(b, true); err != nil {
		t.Fatal(err)
	}
	if _, got := run(); got.dst != be {
		t.Fatalf("with services: %s -> %s, want the backend %s", got.src, got.dst, be)
	}
}
