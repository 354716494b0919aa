package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// harnessIfindex is the interface BPF_PROG_TEST_RUN runs a packet on
// (the loopback device, whose ifindex is 1 in every netns): the
// harness's endpoint entry is for it.
const harnessIfindex = 1

// TC verdicts of the programs.
const (
	verdictPass uint32 = 0 // TC_ACT_OK
	verdictDrop uint32 = 2 // TC_ACT_SHOT
)

// progHarness runs the node's endpoint programs (BPF_PROG_TEST_RUN,
// not attached) for one endpoint, on maps pinned in a test bpffs
// directory: the endpoints entry of the loopback device names it.
type progHarness struct {
	b     *bpfState
	id    endpoint.ID
	slot  uint32 // its policy maps' slot
	pm    *ebpf.Map
	cm    *ebpf.Map
	progs programs
	have  *policy.MapState
	ports map[policy.Key]uint16
}

func newProgHarness(t testing.TB, id endpoint.ID, ident identity.NumericIdentity) *progHarness {
	t.Helper()
	testutil.RequireRoot(t)
	b, err := openBPF(LinuxConfig{BPFFS: testutil.BPFFSDir(t)})
	if err != nil {
		t.Fatalf("open bpf: %v", err)
	}
	t.Cleanup(b.close)
	e, err := b.newEndpointMaps(b.endpointDir(id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	pm, cm := e.policyMap, e.cidrMap
	// BPF_PROG_TEST_RUN runs a packet on the loopback device.
	// The endpoint's addresses are podIP and pod6: from_container drops
	// what it sends from any other.
	if err := b.setEndpointInfo(endpointInfo(id, ident, e.slot, epAddrs{podIP, pod6}), harnessIfindex, 0); err != nil {
		t.Fatal(err)
	}
	progs := b.progs
	return &progHarness{b: b, id: id, slot: e.slot, pm: pm, cm: cm, progs: progs, have: noPolicy}
}

func (h *progHarness) setPolicy(t testing.TB, ms *policy.MapState) {
	t.Helper()
	if ms == nil {
		ms = noPolicy
	}
	ports, err := ms.Redirects(harnessProxyPorts)
	if err != nil {
		t.Fatal(err)
	}
	if err := syncPolicyMap(h.pm, h.cm, policyTarget{h.have, h.ports}, policyTarget{ms, ports}); err != nil {
		t.Fatalf("sync policy: %v", err)
	}
	h.have, h.ports = ms, ports
}

// harnessProxyPorts are the proxy ports the harness's policies redirect
// their L7 entries to.
var harnessProxyPorts = policy.ProxyPorts{policy.ParserHTTP: 15001}

func (h *progHarness) ipcache(t testing.TB, prefix string, id identity.NumericIdentity) {
	t.Helper()
	k := ipcacheKey(netip.MustParsePrefix(prefix))
	if err := h.b.maps.ipcache.Update(k, bpf.EndpointIpcacheValue{Identity: uint32(id)}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

// run runs the program of direction dir on p and returns its verdict.
func (h *progHarness) run(t testing.TB, dir policy.Direction, p pkt) uint32 {
	t.Helper()
	prog := h.progs.to
	if dir == policy.Egress {
		prog = h.progs.from
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: p.bytes()})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret
}
