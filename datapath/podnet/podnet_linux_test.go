package podnet

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestAttachInNetns: a veth made from a host netns other than the
// caller's has its host end there and its peer in the pod's, with the
// addresses and routes Configure gives; a taken name is ErrVethExists,
// and ClearLinks makes room; Rollback removes both ends.
func TestAttachInNetns(t *testing.T) {
	testutil.RequireRoot(t)
	host, podNS := testutil.NewNS(t, "mbpn-host"), testutil.NewNS(t, "mbpn-pod")
	h, err := netns.GetFromPath(host.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p, err := Open(podNS.Path, h)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	hostName, tmpName := VethNames("c1", "eth0")
	v, err := p.CreateVeth(hostName, "eth0", 1400)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CreateVeth(hostName, "eth0", 1400); !errors.Is(err, ErrVethExists) {
		t.Fatalf("second CreateVeth = %v, want ErrVethExists", err)
	}
	addrs := []Addr{
		{IP: netip.MustParseAddr("10.9.0.2"), Gateway: netip.MustParseAddr("10.9.0.1")},
		{IP: netip.MustParseAddr("fd09::2"), Gateway: netip.MustParseAddr("fd09::1")},
	}
	if err := p.Configure(v, addrs, 0); err != nil {
		t.Fatal(err)
	}
	hl, err := p.HostNL.LinkByName(hostName)
	if err != nil || hl.Attrs().Index != v.HostIndex || hl.Attrs().MTU != 1400 || hl.Attrs().HardwareAddr.String() != v.HostMAC.String() {
		t.Fatalf("host end %+v, %v; want index %d MAC %s MTU 1400", hl, err, v.HostIndex, v.HostMAC)
	}
	pl, err := p.NL.LinkByName("eth0")
	if err != nil || pl.Attrs().Index != v.PodIndex || pl.Attrs().HardwareAddr.String() != v.PodMAC.String() || pl.Attrs().OperState == netlink.OperDown {
		t.Fatalf("pod end %+v, %v; want index %d MAC %s, up", pl, err, v.PodIndex, v.PodMAC)
	}
	for _, a := range addrs {
		fam := netlink.FAMILY_V4
		if a.IP.Is6() {
			fam = netlink.FAMILY_V6
		}
		got, err := p.NL.AddrList(pl, fam)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, g := range got {
			found = found || g.IP.Equal(a.IP.AsSlice())
		}
		routes, err := p.NL.RouteList(pl, fam)
		if err != nil {
			t.Fatal(err)
		}
		def := false
		for _, r := range routes {
			def = def || (r.Gw != nil && r.Gw.Equal(a.Gateway.AsSlice()))
		}
		if !found || !def {
			t.Fatalf("%s: address %v, default route via %s %v (addresses %v, routes %v)", a.IP, found, a.Gateway, def, got, routes)
		}
	}
	// The IPv6 gateway's neighbour is permanent, the host end's MAC: the
	// pod never depends on the host's proxy entry for it, which a
	// carrier change of the host end flushes.
	neighs, err := p.NL.NeighList(v.PodIndex, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	gw6 := false
	for _, n := range neighs {
		gw6 = gw6 || (n.IP.Equal(addrs[1].Gateway.AsSlice()) && n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == v.HostMAC.String())
	}
	if !gw6 {
		t.Fatalf("pod neighbours %+v: want %s permanent at %s", neighs, addrs[1].Gateway, v.HostMAC)
	}
	for _, l := range []netlink.Link{hl, pl} {
		if a := l.Attrs(); a.NumTxQueues != 1 || a.NumRxQueues != 1 {
			t.Fatalf("%s: %d tx and %d rx queues, want one each (no cut under the rtnl lock)", a.Name, a.NumTxQueues, a.NumRxQueues)
		}
	}
	if _, err := netlink.LinkByName(hostName); err == nil {
		t.Fatal("host end in the caller's netns, want it in the host netns only")
	}
	if err := p.ClearLinks(hostName, "eth0", tmpName); err != nil {
		t.Fatal(err)
	}
	if _, err := p.HostNL.LinkByName(hostName); !IsLinkNotFound(err) {
		t.Fatalf("host end after ClearLinks: %v", err)
	}
	v, err = p.CreateVeth(hostName, "eth0", 1500)
	if err != nil {
		t.Fatalf("CreateVeth after ClearLinks: %v", err)
	}
	v.Rollback()
	if _, err := p.NL.LinkByName("eth0"); !IsLinkNotFound(err) {
		t.Fatalf("pod end after Rollback: %v", err)
	}
	// A link of the host veth's name that is not a veth (a bridge: this
	// kernel may lack the dummy driver) is left alone by
	// DeleteVeth, deleted by DeleteLink; a missing one is success.
	d := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: hostName}}
	if err := p.HostNL.LinkAdd(d); err != nil {
		t.Fatal(err)
	}
	if err := DeleteVeth(p.HostNL, hostName); err != nil {
		t.Fatal(err)
	}
	if _, err := p.HostNL.LinkByName(hostName); err != nil {
		t.Fatalf("DeleteVeth removed a bridge: %v", err)
	}
	for range 2 {
		if err := DeleteLink(p.HostNL, hostName); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.HostNL.LinkByName(hostName); !IsLinkNotFound(err) {
		t.Fatalf("after DeleteLink: %v", err)
	}
}

// TestOpenRefusesWhatIsNotANetns: a missing path, a plain file and a
// FIFO (whose open would block) are KindNetns errors.
func TestOpenRefusesWhatIsNotANetns(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	file := dir + "/file"
	fifo := dir + "/fifo"
	if err := writeEmpty(file); err != nil {
		t.Fatal(err)
	}
	if err := mkfifo(fifo); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{dir + "/none", file, fifo} {
		p, err := Open(path, netns.None())
		var pe *Error
		if !errors.As(err, &pe) || pe.Kind != KindNetns {
			if p != nil {
				p.Close()
			}
			t.Fatalf("Open(%s) = %v, want a KindNetns error", path, err)
		}
	}
}

// BenchmarkAttach is the agent's share of a CNI ADD's kernel work: open
// the pod netns and its sockets, create the veth, configure the pod side;
// then (untimed) delete the pair.
func BenchmarkAttach(b *testing.B) {
	testutil.RequireRoot(b)
	host, podNS := testutil.NewNS(b, "mbpn-bhost"), testutil.NewNS(b, "mbpn-bpod")
	h, err := netns.GetFromPath(host.Path)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	addrs := []Addr{{IP: netip.MustParseAddr("10.9.0.2"), Gateway: netip.MustParseAddr("10.9.0.1")}}
	hostName, _ := VethNames("bench", "eth0")
	var cpu [3]time.Duration // the process's in each step: open, veth, configure
	for b.Loop() {
		c0 := processCPU()
		p, err := Open(podNS.Path, h)
		if err != nil {
			b.Fatal(err)
		}
		c1 := processCPU()
		v, err := p.CreateVeth(hostName, "eth0", 1500)
		if err != nil {
			b.Fatal(err)
		}
		c2 := processCPU()
		if err := p.Configure(v, addrs, 0); err != nil {
			b.Fatal(err)
		}
		c3 := processCPU()
		cpu[0], cpu[1], cpu[2] = cpu[0]+c1-c0, cpu[1]+c2-c1, cpu[2]+c3-c2
		b.StopTimer()
		v.Rollback()
		p.Close()
		b.StartTimer()
	}
	for i, name := range []string{"open", "veth", "configure"} {
		b.ReportMetric(float64(cpu[i].Microseconds())/1000/float64(b.N), name+"-cpu-ms/op")
	}
}

// processCPU is the process's user+system time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
