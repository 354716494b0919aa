package datapath

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestBPFBench measures the numbers of BENCHMARKS.md (make bench-bpf):
// per-endpoint first realise (policy maps, per-node map entries, TCX or
// cls_bpf attach of the node's programs, plus the host route and
// sysctls), the node's program load, identity change (a map write),
// policy-only regeneration, and kernel memory per endpoint and per node.
// Runs only with MEMBRANE_BENCH_BPF=1; BENCH_N endpoints (default 200).
func TestBPFBench(t *testing.T) {
	if os.Getenv("MEMBRANE_BENCH_BPF") == "" {
		t.Skip("set MEMBRANE_BENCH_BPF=1 (make bench-bpf)")
	}
	n := 200
	if v, err := strconv.Atoi(os.Getenv("BENCH_N")); err == nil && v > 0 {
		n = v
	}
	for _, legacy := range []bool{false, true} {
		name := "tcx"
		if legacy {
			name = "cls_bpf"
		}
		t.Run(name, func(t *testing.T) { benchRealize(t, n, legacy) })
	}
}

func benchRealize(t *testing.T, n int, legacy bool) {
	l, _, nl := newTestLinux(t, LinuxConfig{TeardownDelay: -1, ForceLegacyTC: legacy, EndpointTCX: !legacy})
	ctx := context.Background()
	eps := make([]*endpoint.Endpoint, n)
	for i := range eps {
		eps[i] = benchVeth(t, nl, endpoint.ID(i+1), fmt.Sprintf("lxcb%06d", i), fmt.Sprintf("10.246.%d.%d", i/250, i%250+1))
		eps[i].Identity = identity.NumericIdentity(1000 + i)
		eps[i].Policy = benchPolicy(1, 0)
	}
	first := measure(t, eps, func(ep *endpoint.Endpoint) error { _, err := l.Realize(ctx, ep, 1); return err })
	for _, ep := range eps {
		ep.Policy = benchPolicy(2, 1)
	}
	policyOnly := measure(t, eps, func(ep *endpoint.Endpoint) error { _, err := l.Realize(ctx, ep, 2); return err })
	// The map part alone (what Realize adds to the route refresh).
	for _, ep := range eps {
		ep.Policy = benchPolicy(3, 2)
	}
	mapOnly := measure(t, eps, func(ep *endpoint.Endpoint) error {
		e := l.bpf.eps[ep.ID]
		if err := syncPolicyMap(e.policyMap, e.cidrMap, policyTarget{e.have, e.ports}, policyTarget{ep.Policy, nil}); err != nil {
			return err
		}
		e.have = ep.Policy
		return nil
	})
	loadOnly := measure(t, eps, func(*endpoint.Endpoint) error {
		p, err := l.bpf.tmpl.load(l.bpf.maps)
		p.close()
		return err
	})
	for _, ep := range eps {
		ep.Identity += 10000
	}
	reload := measure(t, eps, func(ep *endpoint.Endpoint) error { _, err := l.Realize(ctx, ep, 4); return err })
	// Agent restart: a new datapath on the same pins realises every
	// endpoint again (TCX: adopts the attached programs).
	l = reopen(t, l)
	restart := measure(t, eps, func(ep *endpoint.Endpoint) error { _, err := l.Realize(ctx, ep, 5); return err })
	t.Logf("endpoints %d (%d policy entries each)", n, len(benchPolicy(1, 0).Allow))
	t.Logf("first realise (policy maps + entries + attach + route/sysctls): %s", first)
	t.Logf("node program load (both programs; once per node, not per endpoint): %s", loadOnly)
	t.Logf("identity change (the endpoints map entry):                  %s", reload)
	t.Logf("first realise after an agent restart:                       %s", restart)
	t.Logf("policy-only regeneration (Realize, 2 adds + 2 removes):     %s", policyOnly)
	t.Logf("policy map diff alone:                                      %s", mapOnly)
	t.Logf("kernel memory per endpoint: %s", endpointMemory(t, l, eps[0]))
}

// benchPolicy is an ingress policy of 20 entries, shifted by k (each
// shift replaces two entries).
func benchPolicy(rev uint64, k int) *policy.MapState {
	var keys []policy.Key
	for i := range 10 {
		keys = append(keys,
			policy.Key{Identity: identity.NumericIdentity(2000 + i + k), Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress},
			policy.Key{Identity: identity.NumericIdentity(3000 + i + k), Dir: policy.Egress})
	}
	return policy.NewMapState(rev, true, true, keys)
}

func benchVeth(t *testing.T, nl *netlink.Handle, id endpoint.ID, name, ip string) *endpoint.Endpoint {
	t.Helper()
	return addVeth(t, nl, id, name, ip)
}

// stats are latency percentiles.
type stats struct{ p50, p99, max, total time.Duration }

func (s stats) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
	return fmt.Sprintf("median %v, p99 %v, max %v, all endpoints one after another %v", r(s.p50), r(s.p99), r(s.max), r(s.total))
}

func measure(t *testing.T, eps []*endpoint.Endpoint, fn func(*endpoint.Endpoint) error) stats {
	t.Helper()
	d := make([]time.Duration, 0, len(eps))
	for _, ep := range eps {
		start := time.Now()
		if err := fn(ep); err != nil {
			t.Fatalf("endpoint %d: %v", ep.ID, err)
		}
		d = append(d, time.Since(start))
	}
	slices.Sort(d)
	var total time.Duration
	for _, x := range d {
		total += x
	}
	return stats{p50: d[len(d)/2], p99: d[(len(d)*99)/100], max: d[len(d)-1], total: total}
}

// endpointMemory sums what the kernel holds per endpoint (its policy
// map: memlock of its current entries, BPF_F_NO_PREALLOC; the empty CIDR
// map) and, apart, per node: the two shared programs (memlock:
// instructions and aux data; plus the JIT images) and the BTF blob
// uploaded with the load.
func endpointMemory(t *testing.T, l *Linux, ep *endpoint.Endpoint) string {
	t.Helper()
	e := l.bpf.eps[ep.ID]
	var progMem, jit, btfSize uint64
	for _, p := range attachedPrograms(t, l, ep) {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		m, _ := info.Memlock()
		progMem += m
		j, _ := info.JitedSize()
		jit += uint64(j)
		if id, ok := info.BTFID(); ok && btfSize == 0 {
			btfSize = btfObjectSize(t, uint32(id))
		}
	}
	var maps uint64
	for _, m := range []*ebpf.Map{e.policyMap, e.cidrMap} {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		ml, _ := info.Memlock()
		maps += ml
	}
	node := progMem + jit + btfSize
	return fmt.Sprintf("per endpoint %d bytes (%.1f KiB): policy map (20 entries) + empty CIDR map; per node (shared by every endpoint) %d bytes (%.1f KiB): programs %d + JIT images %d + BTF %d",
		maps, float64(maps)/1024, node, float64(node)/1024, progMem, jit, btfSize)
}

// btfObjectSize returns the size of the kernel BTF object id
// (BPF_OBJ_GET_INFO_BY_FD on a BTF fd; cilium/ebpf does not expose it).
func btfObjectSize(t *testing.T, id uint32) uint64 {
	t.Helper()
	getFD := struct{ id, next, flags, pad uint32 }{id: id}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_BTF_GET_FD_BY_ID, uintptr(unsafe.Pointer(&getFD)), unsafe.Sizeof(getFD))
	if errno != 0 {
		t.Fatalf("btf get fd by id: %v", errno)
	}
	defer unix.Close(int(fd))
	var info struct {
		btf       uint64
		btfSize   uint32
		id        uint32
		name      uint64
		nameLen   uint32
		kernelBTF uint32
	}
	attr := struct {
		fd, infoLen uint32
		info        uint64
	}{fd: uint32(fd), infoLen: uint32(unsafe.Sizeof(info)), info: uint64(uintptr(unsafe.Pointer(&info)))}
	if _, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr)); errno != 0 {
		t.Fatalf("btf info: %v", errno)
	}
	return uint64(info.btfSize)
}

// attachedPrograms opens the programs attached for ep (closed by
// t.Cleanup): through the pinned TCX links, or the cls_bpf filters.
func attachedPrograms(t *testing.T, l *Linux, ep *endpoint.Endpoint) []*ebpf.Program {
	t.Helper()
	var ids []ebpf.ProgramID
	for _, h := range hooks {
		if lk, err := link.LoadPinnedLink(filepath.Join(l.bpf.endpointDir(ep.ID), h.pin), nil); err == nil {
			info, err := lk.Info()
			lk.Close()
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, info.Program)
			continue
		}
		filters, err := l.nl.FilterList(&netlink.GenericLink{LinkAttrs: netlink.LinkAttrs{Index: ep.IfIndex}}, h.parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == h.name {
				ids = append(ids, ebpf.ProgramID(bf.Id))
			}
		}
	}
	if len(ids) != 2 {
		t.Fatalf("endpoint %d: %d programs attached, want 2", ep.ID, len(ids))
	}
	var progs []*ebpf.Program
	for _, id := range ids {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		progs = append(progs, p)
	}
	return progs
}
