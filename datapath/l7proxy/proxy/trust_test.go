package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// rawRequest writes one request line and headers through the proxy as
// an explicit client from 127.0.0.2 (A) and returns the status line:
// the path goes on the wire exactly as given, as an attacker sends it.
func (r *rig) rawRequest(target string, headers ...string) string {
	r.t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", r.listen)
	if err != nil {
		r.t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET http://" + r.b + target + " HTTP/1.1\r\nHost: " + r.b + "\r\n"
	for _, h := range headers {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"); err != nil {
		r.t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		r.t.Fatalf("%s: %v", target, err)
	}
	return strings.TrimSpace(line)
}

// TestProxyPathNormalised: with A allowed only GET /public/.*, the three
// ways of spelling a step out of /public ("..", "%2e%2e" and an encoded
// slash) never reach B's /private, a protocol upgrade on an allowed path
// is refused instead of becoming an unchecked tunnel, and an allowed
// path reaches B in its normalised form.
func TestProxyPathNormalised(t *testing.T) {
	r := newRig(t)
	r.setB(1, r.l7(idA, policy.HTTPRule{Method: "GET", Path: "/public/.*"}))
	testutil.Eventually(t, "revision 1 acknowledged", func() bool { return r.w.isAcked(1) })
	for _, c := range []struct {
		target, want string
		headers      []string
	}{
		{"/public/../private", " 403 ", nil},
		{"/public/%2e%2e/private", " 403 ", nil},
		{"/public/%2E%2E/private", " 403 ", nil},
		{"/public/..%2fprivate", " 400 ", nil},
		{"/public/..%5Cprivate", " 400 ", nil},
		{"/public//..//private", " 403 ", nil},
		{"/public/ws", " 400 ", []string{"Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"}},
		{"/public/h2c", " 400 ", []string{"Upgrade: h2c", "Connection: Upgrade, HTTP2-Settings", "HTTP2-Settings: AAMAAABkAAQAAP__"}},
		{"/public/./a/../b", " 200 ", nil},
	} {
		if got := r.rawRequest(c.target, c.headers...); !strings.Contains(got+" ", c.want) {
			t.Errorf("GET %s %v: %q, want%s", c.target, c.headers, got, c.want)
		}
	}
	got := r.received()
	if len(got) != 1 || got[0] != "/public/b" {
		t.Errorf("B received %q, want only the normalised allowed path [/public/b]", got)
	}
}

// TestProxyRefusesExplicitFromOffNode: with the proxy listening on every
// address (--l7-proxy-listen 0.0.0.0:port), a client that reaches it on
// a non-loopback address (a pod or an underlay host) cannot use it as a
// forward proxy, whose upstream connection would carry the proxy's
// identity mark; the node's own loopback clients still can.
func TestProxyRefusesExplicitFromOffNode(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNS(t, "mbl7")
	nl := ns.Netlink(t)
	lo, err := nl.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	// A veth pair inside the namespace gives it a non-loopback address.
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "d0"}, PeerName: "d1"}
	if err := nl.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	if peer, err := nl.LinkByName("d1"); err != nil || nl.LinkSetUp(peer) != nil {
		t.Fatalf("veth peer: %v", err)
	}
	if err := nl.AddrAdd(dummy, &netlink.Addr{IPNet: &net.IPNet{IP: net.IP{192, 0, 2, 1}, Mask: net.CIDRMask(24, 32)}}); err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkSetUp(dummy); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w := &waits{}
	srv, err := l7proxy.NewServer(filepath.Join(dir, "xds.sock"), w.tracker(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) { fmt.Fprint(w, "B") }))
	if err := ns.Do(func() error {
		backend.Listener, err = net.Listen("tcp", "127.0.0.4:8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	backend.Start()
	t.Cleanup(backend.Close)
	const port = "15099"
	sup := &l7proxy.Supervisor{Path: "nsenter", Args: []string{"--net=" + ns.Path, "--", buildProxy(t), "--xds", srv.Path(), "--listen", "0.0.0.0:" + port},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, StableAfter: time.Second, Log: slog.Default()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sup.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if _, err := srv.SetIPCache(l7proxy.IPCache{Entries: map[netip.Prefix]identity.NumericIdentity{
		netip.MustParsePrefix("127.0.0.0/8"): identity.ReservedHost, netip.MustParsePrefix("192.0.2.0/24"): idA,
		netip.MustParsePrefix("127.0.0.4/32"): idB,
	}}); err != nil {
		t.Fatal(err)
	}
	v, err := srv.SetEndpoint(1, &l7proxy.EndpointPolicy{ID: 1, IPs: []netip.Addr{netip.MustParseAddr("127.0.0.4")},
		L7: []policy.L7Entry{{Key: policy.Key{Port: 8080, Proto: policy.ProtoTCP, Dir: policy.Ingress}, HTTP: []policy.HTTPRule{{}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if wait, _ := srv.Tracker().Wait(1, 1, v); wait {
		testutil.Eventually(t, "the proxy applied the policy", func() bool { return w.isAcked(1) })
	}
	status := func(proxyAddr, from string) string {
		var line string
		err := ns.Do(func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
			var c net.Conn
			var err error
			for i := 0; i < 100; i++ { // the proxy process may still be starting
				if c, err = d.Dial("tcp", proxyAddr); err == nil || !strings.Contains(err.Error(), "refused") {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(c, "GET http://127.0.0.4:8080/x HTTP/1.1\r\nHost: 127.0.0.4:8080\r\n\r\n"); err != nil {
				return err
			}
			line, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
		if err != nil {
			t.Fatalf("request through %s from %s: %v", proxyAddr, from, err)
		}
		return strings.TrimSpace(line)
	}
	if got := status("192.0.2.1:"+port, "192.0.2.1"); !strings.Contains(got, " 403 ") {
		t.Errorf("explicit request from off the node's loopback: %q, want 403", got)
	}
	if got := status("127.0.0.1:"+port, "127.0.0.1"); !strings.Contains(got, " 200 ") {
		t.Errorf("explicit request on loopback (the node): %q, want 200", got)
	}
}

// TestXDSSocketPrivate: the xDS socket is created with mode 0600 (never
// the umask's), and a process the peer check refuses is disconnected
// before it can subscribe, so it can neither take the proxy's streams
// nor acknowledge a version.
func TestXDSSocketPrivate(t *testing.T) {
	old := unix.Umask(0)
	t.Cleanup(func() { unix.Umask(old) })
	w := &waits{}
	srv, err := l7proxy.NewServer(filepath.Join(t.TempDir(), "xds.sock"), w.tracker(), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	unix.Umask(old)
	var st unix.Stat_t
	if err := unix.Stat(srv.Path(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o777 != 0o600 {
		t.Errorf("xds socket mode %o, want 600", st.Mode&0o777)
	}
	srv.SetPeerCheck(func(cred *unix.Ucred) bool { return false }) // nobody is the supervised proxy
	v, err := srv.SetEndpoint(3, &l7proxy.EndpointPolicy{ID: 3})
	if err != nil {
		t.Fatal(err)
	}
	if wait, _ := srv.Tracker().Wait(3, 1, v); !wait {
		t.Fatal("no wait registered")
	}
	// Five impostors subscribe and would acknowledge everything.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range 5 {
		p := &proxy{log: slog.Default(), access: newAccessLog("")}
		p.state.Store(&state{})
		go p.subscribe(ctx, srv.Path())
	}
	time.Sleep(500 * time.Millisecond) // what the impostors could do in that time; nothing asserts a duration
	if w.isAcked(1) {
		t.Fatal("a refused peer acknowledged a version")
	}
	streams := srv.Streams()
	if streams != 0 {
		t.Fatalf("%d streams open from refused peers", streams)
	}
	// The real proxy (accepted) still subscribes and acknowledges.
	srv.SetPeerCheck(l7proxy.SameUser)
	testutil.Eventually(t, "an accepted peer's acknowledgement", func() bool { return w.isAcked(1) })
}
