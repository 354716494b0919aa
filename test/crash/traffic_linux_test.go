package crash

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
)

// pingLoss matches ping's summary line.
var pingLoss = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// TestTrafficAcrossRestart: two dual-stack pods made by the CNI plugin
// exchange a TCP stream over IPv6 and pings over both families while the
// agent is killed with SIGKILL and restarted, twice. No ping may be lost
// and the TCP connection must carry every byte, in order, without a
// reset.
func TestTrafficAcrossRestart(t *testing.T) {
	ap := linuxAgent(t, "10.253.0.0/24", "--gc-interval", "300ms", "--ipv6-range", "fd00:253::/120")
	ap.Start()
	d := newCNIDriver(t, ap)
	w := newWorld(3)
	a, b := w.newPod(), w.newPod()
	d.mustAdd(t, a)
	ipB, ipB6 := d.mustAddBoth(t, b)
	stream := startStream(tcpEcho(t, a, b, ipB6))

	pingOut := make(chan string, 2)
	for _, ip := range []net.IP{ipB, ipB6} {
		go func() {
			out, err := a.ns.Exec("ping", "-i", "0.01", "-c", "500", "-W", "1", ip.String())
			if err != nil {
				out += err.Error()
			}
			pingOut <- "ping " + ip.String() + "\n" + out
		}()
	}
	for range 2 {
		time.Sleep(800 * time.Millisecond)
		ap.Kill()
		time.Sleep(300 * time.Millisecond) // traffic flows with no agent at all
		ap.Start()
	}
	for range 2 {
		out := <-pingOut
		m := pingLoss.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("ping: %s", out)
		}
		sent, _ := strconv.Atoi(m[1])
		got, _ := strconv.Atoi(m[2])
		what, _, _ := strings.Cut(out, "\n")
		t.Logf("across 2 agent restarts (SIGKILL): %s: %d sent, %d lost", what, sent, sent-got)
		if sent-got != 0 {
			t.Errorf("%d of %d pings lost across agent restarts: %s", sent-got, sent, out)
		}
	}
	sentBytes, err := stream.stop()
	t.Logf("TCP over IPv6: %d bytes echoed in order", sentBytes)
	if err != nil {
		t.Fatalf("TCP stream: %v", err)
	}
}

// mustAdd runs ADD for p and returns its IPv4 address.
func (d *cniDriver) mustAdd(t *testing.T, p *pod) net.IP {
	t.Helper()
	v4, _ := d.mustAddBoth(t, p)
	return v4
}

// mustAddBoth runs ADD for p and returns its IPv4 and IPv6 address (nil
// for a family the agent does not serve).
func (d *cniDriver) mustAddBoth(t *testing.T, p *pod) (v4, v6 net.IP) {
	t.Helper()
	if err := d.add(context.Background(), p); err != nil {
		t.Fatalf("ADD %s: %v", p.name, err)
	}
	cached, err := d.agent.CNI().GetNetworkListCachedResult(d.agent.Conf, d.rt(p))
	if err != nil {
		t.Fatal(err)
	}
	res, err := types100.NewResultFromResult(cached)
	if err != nil {
		t.Fatal(err)
	}
	for _, ipc := range res.IPs {
		if ipc.Address.IP.To4() != nil {
			v4 = ipc.Address.IP
		} else {
			v6 = ipc.Address.IP
		}
	}
	return v4, v6
}

// tcpEcho starts a TCP echo server in b and returns a connection to it
// from a (both sockets made inside the pods' netns).
func tcpEcho(t *testing.T, a, b *pod, ipB net.IP) net.Conn {
	t.Helper()
	addr := net.JoinHostPort(ipB.String(), "7000")
	var lis net.Listener
	if err := b.ns.Do(func() (err error) { lis, err = net.Listen("tcp", addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		conn, err := lis.Accept()
		if err == nil {
			_, _ = io.Copy(conn, conn)
			conn.Close()
		}
	}()
	var conn net.Conn
	if err := a.ns.Do(func() (err error) { conn, err = net.DialTimeout("tcp", addr, 5*time.Second); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// stream writes counters to an echo connection and checks that they come
// back in order.
type stream struct {
	conn  net.Conn
	quit  chan struct{}
	wrote chan uint64 // how many counters the writer sent, at its end
	errc  chan error  // the reader's verdict
	read  atomic.Uint64
}

func startStream(conn net.Conn) *stream {
	s := &stream{conn: conn, quit: make(chan struct{}), wrote: make(chan uint64, 1), errc: make(chan error, 1)}
	go func() {
		var n uint64
		buf := make([]byte, 8)
		defer func() { s.wrote <- n }()
		for {
			select {
			case <-s.quit:
				return
			default:
			}
			binary.BigEndian.PutUint64(buf, n)
			if _, err := conn.Write(buf); err != nil {
				s.errc <- fmt.Errorf("write counter %d: %w", n, err)
				return
			}
			n++
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		buf := make([]byte, 8)
		for want := uint64(0); ; want++ {
			if _, err := io.ReadFull(conn, buf); err != nil {
				if errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) {
					s.errc <- nil
				} else {
					s.errc <- fmt.Errorf("read counter %d: %w", want, err)
				}
				return
			}
			if got := binary.BigEndian.Uint64(buf); got != want {
				s.errc <- fmt.Errorf("counter %d came back as %d", want, got)
				return
			}
			s.read.Store(want + 1)
		}
	}()
	return s
}

// stop stops the writer, waits until every counter it wrote came back,
// and returns the bytes echoed.
func (s *stream) stop() (int, error) {
	close(s.quit)
	var n uint64
	select {
	case n = <-s.wrote:
	case err := <-s.errc:
		return 0, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.read.Load() < n {
		select {
		case err := <-s.errc:
			return 0, err
		default:
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d of %d counters came back", s.read.Load(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.conn.Close()
	return int(n) * 8, nil
}
