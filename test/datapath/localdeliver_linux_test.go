package datapath_test

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

// TestLocalDelivery checks the direct local delivery (bpf/endpoint.c,
// local_deliver): pod to pod on one node, TCP and UDP, IPv4 and IPv6,
// both directions go from the sender's from_container straight to the
// receiver's host veth: not one packet of theirs crosses the host's
// FORWARD hook, whose counting rules would see whatever the host's stack
// forwards. A connection whose request the host's netfilter translated
// (kube-proxy's DNAT of a ClusterIP to the pod) has its replies cross
// the host's stack too, which reverses the translation: the client sees
// the frontend answer (whoTCP checks the connection's peer), not the
// backend, which it would reset. And the packets still leave through the
// receiver's host veth, past its qdisc (a chained bandwidth plugin's TBF
// shapes what reaches the pod there): a root qdisc on it counts at least
// as many packets (GSO segments) as the pod's eth0 receives.
func TestLocalDelivery(t *testing.T) {
	e := newEnvStack(t, "10.244.39.0/24", "fd00:244:39::/120")
	startAgent(e, nil)
	c := e.Client()
	a := addPolicyPod(t, e, c, "a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "b", "k8s:app=b")
	b.nameServer(t, 8080)
	tc := testutil.RequireTool(t, "tc")
	veth, _ := cni.VethNames(b.RT.ContainerID, b.RT.IfName)
	if out, err := e.NS.Exec(tc, "qdisc", "add", "dev", veth, "root", "tbf", "rate", "10gbit", "burst", "1mb", "latency", "100ms"); err != nil {
		t.Fatalf("tbf on %s: %v: %s", veth, err, out)
	}
	rx := func() uint64 {
		l, err := b.NS.Netlink(t).LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		return l.Attrs().Statistics.RxPackets
	}
	rx0 := rx()

	tools := map[bool]string{true: testutil.RequireTool(t, "iptables"), false: testutil.RequireTool(t, "ip6tables")} // by Is4
	for _, ip := range a.ips {
		for _, r := range [][2]netip.Addr{{ip, b.ip(ip)}, {b.ip(ip), ip}} {
			if out, err := e.NS.Exec(tools[ip.Is4()], "-A", "FORWARD", "-s", r[0].String(), "-d", r[1].String()); err != nil {
				t.Fatalf("counting rule: %v: %s", err, out)
			}
		}
	}
	for _, ip := range b.ips {
		fe := netip.AddrPortFrom(ip, 8080)
		for range 3 {
			if name := a.whoTCP(t, fe); name != podName(b) {
				t.Fatalf("%s answered for %s, want %s", name, fe, podName(b))
			}
			if name := a.whoUDP(t, fe); name != podName(b) {
				t.Fatalf("%s answered for %s (UDP), want %s", name, fe, podName(b))
			}
		}
	}
	for is4, tool := range tools {
		fam := map[bool]string{true: "IPv4", false: "IPv6"}[is4]
		out, err := e.NS.Exec(tool, "-nvxL", "FORWARD")
		if err != nil {
			t.Fatalf("%s: %v: %s", tool, err, out)
		}
		// Each counting rule's line (no target; protocol "all", or
		// "0" from iptables-nft) starts with its packet count.
		ms := regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s+(?:all|0)\s+--`).FindAllStringSubmatch(out, -1)
		if len(ms) != 2 {
			t.Fatalf("%s: %d counting rules in FORWARD, want 2:\n%s", fam, len(ms), out)
		}
		for _, m := range ms {
			if n, _ := strconv.Atoi(m[1]); n != 0 {
				t.Errorf("%s: the host forwarded %d packets between the pods, want none (delivered directly):\n%s", fam, n, out)
			}
		}
	}

	out, err := e.NS.Exec(tc, "-s", "qdisc", "show", "dev", veth, "root")
	if err != nil {
		t.Fatalf("tc: %v: %s", err, out)
	}
	m := regexp.MustCompile(`Sent \d+ bytes (\d+) pkt`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no qdisc counters on %s:\n%s", veth, out)
	}
	if sent, _ := strconv.ParseUint(m[1], 10, 64); sent == 0 || sent < rx()-rx0 {
		t.Errorf("the qdisc on %s sent %d packets, the pod received %d: want all through it:\n%s", veth, sent, rx()-rx0, out)
	}

	// kube-proxy's DNAT in the host's stack: the request crosses it, and
	// so must the reply.
	vip := netip.MustParseAddr("10.96.39.10")
	kubeProxyRules(t, e, vip, 80, b.ip(vip), b.ip(vip))
	for range 3 {
		if name := a.whoTCP(t, netip.AddrPortFrom(vip, 80)); name != podName(b) {
			t.Fatalf("%s answered for the kube-proxy frontend, want %s", name, podName(b))
		}
	}
}

// TestLocalDeliveryLostConntrack: a connection whose request leg the
// host's netfilter translated (kube-proxy's DNAT of a ClusterIP to the
// pod) loses the backend's conntrack entry mid-way (evicted: here
// deleted), while the backend owes an answer. The answer begins nothing
// (a TCP segment without SYN), so from_container must not deliver it
// directly as if it opened a connection: the host's stack must see it,
// whose netfilter reverses the DNAT, so that the client gets it from the
// frontend and not from the backend's address (which its socket would
// reset).
func TestLocalDeliveryLostConntrack(t *testing.T) {
	e := newEnvStack(t, "10.244.39.0/24", "fd00:244:39::/120")
	startAgent(e, nil)
	c := e.Client()
	a := addPolicyPod(t, e, c, "a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "b", "k8s:app=b")
	vip := netip.MustParseAddr("10.96.39.11")
	be := b.ip(vip)

	// A server in b that answers only when told to.
	got, release := make(chan struct{}), make(chan struct{})
	var ln net.Listener
	if err := b.NS.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(be, 8080).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		s, err := ln.Accept()
		if err != nil {
			return
		}
		defer s.Close()
		r := bufio.NewReader(s)
		for {
			if _, err := r.ReadString('\n'); err != nil {
				return
			}
			got <- struct{}{}
			<-release
			if _, err := s.Write([]byte(podName(b) + "\n")); err != nil {
				return
			}
		}
	}()
	kubeProxyRules(t, e, vip, 80, be, be)

	conn, err := a.dialService(vip, 80, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.c.Close()
	ask := func(lose bool) {
		t.Helper()
		_ = conn.c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := conn.c.Write([]byte("who\n")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the request never reached the backend")
		}
		if lose {
			if n := deleteCTOfPort(t, e, 8080); n == 0 {
				t.Fatal("no conntrack entry of the backend's port to delete")
			}
		}
		release <- struct{}{}
		line, err := conn.r.ReadString('\n')
		if err != nil || strings.TrimSpace(line) != podName(b) {
			t.Fatalf("answer %q, %v; want %s from the frontend %s:80", line, err, podName(b), vip)
		}
	}
	ask(false)
	ask(true) // the backend's entry lost between request and answer
	ask(false)
}

// deleteCTOfPort deletes the conntrack entries (pinned at <bpffs>/ct) of
// TCP connections from or to port and returns how many there were.
func deleteCTOfPort(t *testing.T, e *nodeharness.Node, port uint16) int {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(e.BPFFS, "ct"), nil)
	if err != nil {
		t.Fatalf("open conntrack map: %v", err)
	}
	defer m.Close()
	var (
		k    bpf.EndpointCtKey
		v    bpf.EndpointCtValue
		keys []bpf.EndpointCtKey
	)
	p := binary.BigEndian.Uint16(binary.NativeEndian.AppendUint16(nil, port)) // network order in memory
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Proto == 6 && (k.Sport == p || k.Dport == p) {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read conntrack map: %v", err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil {
			t.Fatalf("delete conntrack entry: %v", err)
		}
	}
	return len(keys)
}

// TestLocalDeliveryFragments: a UDP datagram larger than the pods' MTU
// leaves pod a in IPv4 fragments, and local_deliver leaves every one of
// them to the host's stack, the first (MF set, offset 0: it carries the
// UDP header) too: the host's reassembly must see all of a datagram or
// none. A counting rule in FORWARD on the datagram's destination port
// matches only a first fragment (later ones have no UDP header) or the
// datagram the host reassembled from it, so it must count; a first
// fragment delivered straight to b's veth would leave it at 0 (and the
// host's reassembly, when on, without the datagram's head).
func TestLocalDeliveryFragments(t *testing.T) {
	e := newEnvStack(t, "10.244.39.0/24", "fd00:244:39::/120")
	startAgent(e, nil)
	c := e.Client()
	a := addPolicyPod(t, e, c, "a", "k8s:app=a")
	b := addPolicyPod(t, e, c, "b", "k8s:app=b")
	src := a.ip(netip.MustParseAddr("10.0.0.1"))
	dst := b.ip(src)
	const port = 8091
	iptables := testutil.RequireTool(t, "iptables")
	if out, err := e.NS.Exec(iptables, "-A", "FORWARD", "-s", src.String(), "-d", dst.String(), "-p", "udp", "--dport", strconv.Itoa(port)); err != nil {
		t.Fatalf("counting rule: %v: %s", err, out)
	}
	var pc net.PacketConn
	if err := b.NS.Do(func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(dst, port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	const size = 4000 // three fragments at an MTU of 1500
	got := 0
	buf := make([]byte, 2*size)
	for try := 0; try < 5 && got != size; try++ { // datagrams may be lost; bounded
		if err := a.NS.Do(func() error {
			conn, err := net.Dial("udp", netip.AddrPortFrom(dst, port).String())
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write(make([]byte, size))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		got, _, _ = pc.ReadFrom(buf)
	}
	if got != size {
		t.Fatalf("b received a datagram of %d bytes, want %d", got, size)
	}
	out, err := e.NS.Exec(iptables, "-nvxL", "FORWARD")
	if err != nil {
		t.Fatalf("iptables: %v: %s", err, out)
	}
	m := regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s+(?:udp|17)\s+--`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no counting rule in FORWARD:\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n == 0 {
		t.Errorf("the host forwarded no first fragment of a's datagram to b (delivered directly?):\n%s", out)
	}
}
