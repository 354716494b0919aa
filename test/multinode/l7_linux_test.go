package multinode

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// l7PolicyDoc: app=l7client may GET /public on app=l7server:8080
// (egress, an L7 rule: the client's node redirects to its proxy);
// app=l7server admits app=l7client on 8080 and nobody else (ingress,
// L4: the server's node judges the identity the packets carry).
const l7PolicyDoc = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l7-client, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: l7client}}
  egress:
  - toEndpoints: [{matchLabels: {app: l7server}}]
    toPorts:
    - ports: [{port: "8080", protocol: TCP}]
      rules:
        http: [{method: GET, path: /public}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l7-server, namespace: default}
spec:
  endpointSelector: {matchLabels: {app: l7server}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: l7client}}]
    toPorts:
    - ports: [{port: "8080", protocol: TCP}]
`

// peerServer serves HTTP on ip:8080 in p's netns, answering each
// request with "<method> <path> from <client address>".
func peerServer(t *testing.T, p *pod, ip netip.Addr) {
	t.Helper()
	var l net.Listener
	err := p.ns.Do(func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(ip, 8080).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		from, _ := netip.ParseAddrPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s %s from %s", r.Method, r.URL.Path, from.Addr().Unmap())
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// get sends GET path to ip:8080 from p (an ordinary client: the BPF
// programs redirect it) and returns the status and body.
func get(p *pod, ip netip.Addr, path string, timeout time.Duration) (int, string, error) {
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := p.ns.Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}
	resp, err := (&http.Client{Transport: tr, Timeout: timeout}).Get("http://" + netip.AddrPortFrom(ip, 8080).String() + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestCrossNodeL7Identity (root, real traffic, native and tunnel
// routing, kvstore mode): a client pod's egress L7 rule toward a server
// pod on another node whose ingress policy admits only the client's
// labels. The client's proxy decides the request and its upstream
// connection keeps the client's address, so the server's node sees the
// client's identity (from its ipcache in native routing, from the VNI
// in tunnel mode) and admits it: GET /public passes, and the server
// sees the client's address; GET /private gets the proxy's 403; another
// pod of the client's node is refused by the server's ingress policy.
// IPv4 and IPv6.
func TestCrossNodeL7Identity(t *testing.T) {
	for i, mode := range []string{"native", "tunnel"} {
		t.Run(mode, func(t *testing.T) {
			c := newKvClusterOpts(t, mode, 2, 93+i, false, func(c *cluster) { c.l7 = true })
			a, b := c.nodes[0], c.nodes[1]
			waitRoutes(t, a, b)
			client, other, server := a.addPod("l7-client"), a.addPod("l7-other"), b.addPod("l7-server")
			labelPod(t, client, "k8s:app=l7client")
			labelPod(t, other, "k8s:app=other")
			labelPod(t, server, "k8s:app=l7server")
			for _, nd := range c.nodes {
				if _, err := nd.api.PolicyImport(context.Background(), []byte(l7PolicyDoc), "application/yaml"); err != nil {
					t.Fatalf("%s: import policy: %v", nd.name, err)
				}
			}
			waitIPCache(t, c, c.nodes)
			for _, ip := range []netip.Addr{server.ip4, server.ip6} {
				peerServer(t, server, ip)
				from := client.ip4
				if ip.Is6() {
					from = client.ip6
				}
				testutil.EventuallyErr(t, fmt.Sprintf("client GET /public at %s", ip), func() error {
					code, body, err := get(client, ip, "/public", 5*time.Second)
					if err != nil || code != 200 {
						return fmt.Errorf("%d %q %v", code, body, err)
					}
					if want := "GET /public from " + from.String(); body != want {
						return fmt.Errorf("the server answered %q, want %q", body, want)
					}
					return nil
				})
				if code, body, err := get(client, ip, "/private", 10*time.Second); err != nil || code != 403 || !strings.Contains(body, "Access denied") {
					t.Errorf("client GET /private at %s = %d %q %v, want the proxy's 403", ip, code, body, err)
				}
				if err := testutil.Exchange(other.ns, ip, 8080, 2*time.Second); err == nil {
					t.Errorf("app=other reached %s:8080: the server's ingress policy admits only app=l7client", ip)
				}
			}
		})
	}
}
