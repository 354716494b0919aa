package dnsproxy

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/datapath"
)

// countingDial dials from this netns and counts the dials.
type countingDial struct {
	mu sync.Mutex
	n  int
}

func (d *countingDial) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.n++
	d.mu.Unlock()
	return datapath.NetnsSockets{}.DialHost(ctx, network, addr)
}

func (d *countingDial) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestUpstreamSocketsMadeAhead: after a query to a server, the next ones
// find sockets to it made ahead (no dial on their path), each socket
// serves one query from its own port, the servers kept are bounded, and
// the sockets waiting are closed when the proxy stops.
func TestUpstreamSocketsMadeAhead(t *testing.T) {
	server := testServer(t, "udp")
	d := &countingDial{}
	u := newUpstreams(d.dial)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	start := func() {
		go func() { defer close(done); u.run(ctx) }()
	}

	ask := func(c net.Conn) {
		t.Helper()
		defer c.Close()
		co := &dns.Conn{Conn: c}
		r, _, err := (&dns.Client{Net: "udp", Timeout: 5 * time.Second}).ExchangeWithConn(question("allowed.test."), co)
		if err != nil || len(r.Answer) != 1 {
			t.Fatalf("query through an upstream socket: %v %v", r, err)
		}
	}
	c, err := u.get(ctx, server)
	if err != nil {
		t.Fatal(err)
	}
	if d.count() != 1 {
		t.Fatalf("the first query made %d dials, want its own", d.count())
	}
	// The maker starts now (as Serve's would run beside the queries).
	start()
	defer func() { cancel(); <-done }()
	used := []net.Conn{c}
	ask(c)
	// A query asks for sockets once answered, not while it waits for
	// its answer.
	if len(u.want) != 0 {
		t.Fatal("taking a socket asked for its replacement before the query was answered")
	}
	u.refill(server)
	waitFor(t, "sockets made ahead", func() bool { return u.waiting(server) == upstreamDepth })
	for i := range 5 {
		ahead := map[string]bool{}
		u.mu.Lock()
		for _, c := range u.ready[server] {
			ahead[c.LocalAddr().String()] = true
		}
		u.mu.Unlock()
		c, err := u.get(ctx, server)
		if err != nil {
			t.Fatal(err)
		}
		if !ahead[c.LocalAddr().String()] {
			t.Fatalf("query %d got a socket not made ahead (%s) with %d waiting", i, c.LocalAddr(), len(ahead))
		}
		if slices.Contains(used, c) {
			t.Fatalf("query %d got a socket used before (%s)", i, c.LocalAddr())
		}
		used = append(used, c)
		ask(c)
		u.refill(server)
		waitFor(t, "the socket taken to be replaced", func() bool { return u.waiting(server) == upstreamDepth })
	}
	// Bounded: more servers than maxUpstreamServers never keep more.
	for i := range maxUpstreamServers + 5 {
		other := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(20000+i))
		c, err := u.get(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		c.Close()
		u.refill(other)
		waitFor(t, "sockets to another server", func() bool { return u.waiting(other) == upstreamDepth })
		u.mu.Lock()
		n := len(u.ready)
		u.mu.Unlock()
		if n > maxUpstreamServers {
			t.Fatalf("%d servers keep sockets, bound %d", n, maxUpstreamServers)
		}
	}
	cancel()
	<-done
	u.mu.Lock()
	n := len(u.ready)
	u.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d servers' sockets left after the proxy stopped", n)
	}
}
