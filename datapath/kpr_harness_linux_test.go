package datapath

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// The socket-LB client process: sockClientEnv is "tcp", "udp" (unconnected
// sendto/recvfrom, a new socket each time), "udpsock" (all from one
// unconnected socket), "udpconn" (connect, send, recv) or "connect"
// (connect() alone, timed); it makes
// sockClientN exchanges with sockClientAddr and prints one line each:
// "peer=<address the socket reports> backend=<what the server said>", or
// "error=<err>".
const (
	sockClientEnv  = "MEMBRANE_TEST_SOCK_CLIENT"
	sockClientAddr = "MEMBRANE_TEST_SOCK_ADDR"
	sockClientN    = "MEMBRANE_TEST_SOCK_N"
)

func sockClientMain() int {
	addr, err := netip.ParseAddrPort(os.Getenv(sockClientAddr))
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 2
	}
	n, _ := strconv.Atoi(os.Getenv(sockClientN))
	if os.Getenv(sockClientEnv) == "udpsock" {
		return udpOneSocket(addr, n)
	}
	for range n {
		mode := os.Getenv(sockClientEnv)
		if mode == "stream" {
			// 1 GiB over one connection, in MB/s (make bench-kpr).
			mbps, err := streamTo(addr.String(), 1<<30)
			if err != nil {
				fmt.Println("error=" + strings.ReplaceAll(err.Error(), " ", "_"))
				continue
			}
			fmt.Printf("peer=%s backend=%.0f\n", addr, mbps)
			continue
		}
		if mode == "connect" {
			// connect() alone, timed (make bench-kpr).
			start := time.Now()
			c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
			if err != nil {
				fmt.Println("error=" + strings.ReplaceAll(err.Error(), " ", "_"))
				continue
			}
			d := time.Since(start)
			c.Close()
			fmt.Printf("peer=%s backend=%d\n", addr, d.Nanoseconds())
			continue
		}
		peer, backend, err := sockExchange(mode, addr)
		if err != nil {
			fmt.Println("error=" + strings.ReplaceAll(err.Error(), " ", "_"))
			continue
		}
		fmt.Printf("peer=%s backend=%s\n", peer, backend)
	}
	return 0
}

// streamTo sends size bytes over one TCP connection to addr, in MB/s.
func streamTo(addr string, size int) (float64, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	buf := make([]byte, 256<<10)
	start := time.Now()
	for sent := 0; sent < size; sent += len(buf) {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	return float64(size) / 1e6 / time.Since(start).Seconds(), nil
}

// udpOneSocket makes n exchanges from one unconnected UDP socket.
func udpOneSocket(addr netip.AddrPort, n int) int {
	c, err := net.ListenUDP("udp", nil)
	if err != nil {
		fmt.Println("error=" + err.Error())
		return 2
	}
	defer c.Close()
	buf := make([]byte, 128)
	for range n {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.WriteToUDPAddrPort([]byte("who"), addr); err != nil {
			fmt.Println("error=" + strings.ReplaceAll(err.Error(), " ", "_"))
			continue
		}
		k, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			fmt.Println("error=" + strings.ReplaceAll(err.Error(), " ", "_"))
			continue
		}
		fmt.Printf("peer=%s backend=%s\n", netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), strings.ReplaceAll(strings.TrimSpace(string(buf[:k])), " ", "_"))
	}
	return 0
}

// sockExchange makes one exchange; peer is getpeername (tcp, udpconn) or
// the reply's source (udp).
func sockExchange(mode string, addr netip.AddrPort) (peer, backend string, err error) {
	buf := make([]byte, 128)
	dl := time.Now().Add(5 * time.Second)
	switch mode {
	case "tcp", "udpconn":
		network := map[string]string{"tcp": "tcp", "udpconn": "udp"}[mode]
		c, err := net.DialTimeout(network, addr.String(), 5*time.Second)
		if err != nil {
			return "", "", err
		}
		defer c.Close()
		_ = c.SetDeadline(dl)
		if peer, err = getpeername(c.(syscall.Conn)); err != nil {
			return "", "", err
		}
		if _, err := c.Write([]byte("who")); err != nil {
			return "", "", err
		}
		n, err := c.Read(buf)
		if err != nil {
			return "", "", err
		}
		return peer, strings.TrimSpace(string(buf[:n])), nil
	case "udp":
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return "", "", err
		}
		defer c.Close()
		_ = c.SetDeadline(dl)
		if _, err := c.WriteToUDPAddrPort([]byte("who"), addr); err != nil {
			return "", "", err
		}
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return "", "", err
		}
		return netip.AddrPortFrom(from.Addr().Unmap(), from.Port()).String(), strings.TrimSpace(string(buf[:n])), nil
	}
	return "", "", fmt.Errorf("mode %q", mode)
}

// getpeername asks the kernel (not Go's cached address).
func getpeername(c syscall.Conn) (string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", err
	}
	var sa unix.Sockaddr
	var serr error
	if err := rc.Control(func(fd uintptr) { sa, serr = unix.Getpeername(int(fd)) }); err != nil {
		return "", err
	}
	if serr != nil {
		return "", serr
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String(), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String(), nil
	}
	return "", fmt.Errorf("getpeername: %T", sa)
}

// sockResult is one exchange of the client process.
type sockResult struct{ peer, backend, err string }

// runSockClient runs the client process in ns and cgroup cg (started in
// it: clone3 CLONE_INTO_CGROUP) for n exchanges with addr.
func runSockClient(t *testing.T, ns *testutil.NS, cg, mode string, addr netip.AddrPort, n int) []sockResult {
	t.Helper()
	f, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []byte
	err = ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0])
		cmd.Env = append(os.Environ(), sockClientEnv+"="+mode, sockClientAddr+"="+addr.String(), sockClientN+"="+strconv.Itoa(n))
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		t.Fatalf("socket client %s %s: %v (%s)", mode, addr, err, out)
	}
	var res []sockResult
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var r sockResult
		for _, kv := range strings.Fields(sc.Text()) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "peer":
				r.peer = v
			case "backend":
				r.backend = v
			case "error":
				r.err = v
			}
		}
		res = append(res, r)
	}
	if len(res) != n {
		t.Fatalf("socket client %s %s: %d results, want %d: %s", mode, addr, len(res), n, out)
	}
	return res
}

// newCgroup makes a cgroup2 directory for the test's client processes.
func newCgroup(t *testing.T) string {
	t.Helper()
	return testutil.Cgroup2Dir(t)
}

// whoServer answers every TCP connection and UDP datagram on addr:port
// inside ns with "<addr> <the peer's address>", until t ends.
func whoServer(t *testing.T, ns *testutil.NS, addr netip.Addr, port int) {
	t.Helper()
	hp := net.JoinHostPort(addr.String(), strconv.Itoa(port))
	var ln net.Listener
	var pc net.PacketConn
	if err := ns.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp", hp); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", hp)
		return err
	}); err != nil {
		t.Fatalf("server on %s: %v", hp, err)
	}
	t.Cleanup(func() { ln.Close(); pc.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = c.Read(make([]byte, 16))
				_, _ = io.WriteString(c, addr.String()+" "+c.RemoteAddr().String()+"\n")
			}()
		}
	}()
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(addr.String()+" "+from.String()+"\n"), from)
		}
	}()
}

// newKPRNode starts a Linux datapath in a fresh host netns after prep
// made the netns's devices (the uplinks must exist at Init).
func newKPRNode(t *testing.T, cfg LinuxConfig, prep func(host *testutil.NS, nl *netlink.Handle)) (*Linux, *testutil.NS, *netlink.Handle) {
	t.Helper()
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-kpr")
	nl := host.Netlink(t)
	if prep != nil {
		prep(host, nl)
	}
	cfg.HostNetns = host.Path
	if cfg.BPFFS == "" {
		cfg.BPFFS = testutil.BPFFSDir(t)
	}
	if cfg.Gateways == nil {
		cfg.Gateways, cfg.GatewayDevice = []netip.Addr{e2eGateway}, "mbt_gw"
	}
	cfg.TeardownDelay = -1
	l, err := NewLinux(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Init(context.Background()); err != nil {
		t.Fatalf("Init: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, host, nl
}

// linkNS connects netns a and b with a veth: aName in a with aAddr,
// bName in b with bAddr (prefixes), both up.
func linkNS(t *testing.T, a *testutil.NS, aNL *netlink.Handle, aName, aAddr string, b *testutil.NS, bName, bAddr string) {
	t.Helper()
	hb, err := b.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer hb.Close()
	attrs := netlink.NewLinkAttrs()
	attrs.Name = aName
	if err := aNL.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: bName, PeerNamespace: netlink.NsFd(int(hb))}); err != nil {
		t.Fatalf("veth %s-%s: %v", aName, bName, err)
	}
	bNL := b.Netlink(t)
	for _, x := range []struct {
		nl   *netlink.Handle
		name string
		addr string
	}{{aNL, aName, aAddr}, {bNL, bName, bAddr}} {
		lk, err := x.nl.LinkByName(x.name)
		if err != nil {
			t.Fatal(err)
		}
		pfx := netip.MustParsePrefix(x.addr)
		ad := &netlink.Addr{IPNet: &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())}}
		if pfx.Addr().Is6() {
			ad.Flags = unix.IFA_F_NODAD
		}
		if err := x.nl.AddrAdd(lk, ad); err != nil {
			t.Fatal(err)
		}
		if err := x.nl.LinkSetUp(lk); err != nil {
			t.Fatal(err)
		}
	}
}
