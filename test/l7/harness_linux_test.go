package l7

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(relayEnv); spec != "" {
		relayMain(spec)
	}
	os.Exit(nodeharness.Main(m, "membrane-proxy", "membranectl"))
}

// Bounds of requests (not timing assertions): one policy should drop is
// given up after dropTimeout; one that should pass has okTimeout.
const (
	dropTimeout = 1500 * time.Millisecond
	okTimeout   = 10 * time.Second
)

// node is a netns standing in for the node with an agent on the Linux
// datapath and its L7 proxy, and pods a, b, c made by membrane-cni.
type node struct {
	t      *testing.T
	node   *nodeharness.Node
	c      *client.Client
	socket string
	cfg    func(*agent.Config) // the agent's configuration on the node's
	pods   map[string]*pod
	mu     sync.Mutex
	events []events.Event
}

type pod struct {
	name string
	ns   *testutil.NS
	hp   *nodeharness.Pod // nil once deleted
	ip   netip.Addr
	ep   *models.Endpoint
}

// nodeOpts tunes newNode: proxy is the proxy executable (default the
// real one), proxyWait the endpoint actors' ProxyWaitTimeout.
type nodeOpts struct {
	proxy     string
	proxyWait time.Duration
	pods      []string
	// noEvents: no event stream subscriber (benchmarks: the test's own
	// reader would compete for the CPU).
	noEvents bool
	// agent changes the agent's configuration further (nil: nothing).
	agent func(*agent.Config)
}

func newNode(t *testing.T, cidr string, o nodeOpts) *node {
	t.Helper()
	testutil.RequireRoot(t)
	if o.proxy == "" {
		o.proxy = nodeharness.Bin("membrane-proxy")
	}
	if o.pods == nil {
		o.pods = []string{"a", "b", "c"}
	}
	// The node's cleanup stops the agent after the pods' DELs.
	hn := nodeharness.New(t, nodeharness.Options{Prefix: "mbt-l7", IPv4Range: cidr, Network: "membrane-l7"})
	n := &node{t: t, node: hn, socket: hn.Socket, pods: map[string]*pod{}}
	n.cfg = func(cfg *agent.Config) {
		cfg.Linux.L7 = datapath.L7Config{ProxyPath: o.proxy, XDSSocket: filepath.Join(hn.Dir, "xds.sock"), Listen: "127.0.0.1:15001",
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, StableAfter: time.Second}
		cfg.Actors.Endpoint.ProxyWaitTimeout = o.proxyWait
		if o.agent != nil {
			o.agent(cfg)
		}
	}
	n.start()
	if !o.noEvents {
		n.watchEvents()
	}
	for _, name := range o.pods {
		n.addPod(name)
	}
	return n
}

// start starts an agent on the node's configuration (and state).
func (n *node) start() {
	n.t.Helper()
	n.node.StartAgent(n.cfg)
	n.c = n.node.Client()
}

// stop stops the agent (gracefully: endpoints stay in the kernel).
func (n *node) stop() {
	n.t.Helper()
	n.c.Close()
	n.node.StopAgent()
}

// watchEvents collects the event stream (as membranectl monitor reads
// it) until the test ends.
func (n *node) watchEvents() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = n.c.Events(ctx, nil, func(ev events.Event) bool {
			n.mu.Lock()
			n.events = append(n.events, ev)
			n.mu.Unlock()
			return true
		})
	}()
	n.t.Cleanup(func() { cancel(); <-done })
}

// event returns the first collected event match accepts.
func (n *node) event(match func(events.Event) bool) (events.Event, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ev := range n.events {
		if match(ev) {
			return ev, true
		}
	}
	return events.Event{}, false
}

// addPod runs CNI ADD for a pod labelled app=<name> in namespace
// default and deletes it (CNI DEL) when the test ends unless delPod did.
func (n *node) addPod(name string) *pod {
	n.t.Helper()
	hp := n.node.NewPod(name)
	n.node.MustAdd(hp)
	p := &pod{name: name, ns: hp.NS, hp: hp, ip: hp.IPv4}
	var err error
	if p.ep, err = n.c.EndpointPatchLabels(context.Background(), "container-id:"+hp.RT.ContainerID, []string{"k8s:app=" + name}, nil); err != nil {
		n.t.Fatalf("label pod %s: %v", name, err)
	}
	n.pods[name] = p
	n.t.Cleanup(func() {
		if p.hp != nil {
			if err := n.delPod(p); err != nil {
				n.t.Errorf("DEL %s: %v", name, err)
			}
		}
	})
	return p
}

func (n *node) delPod(p *pod) error {
	err := n.node.Del(p.hp)
	if err == nil {
		p.hp = nil
	}
	return err
}

// httpServer serves "<pod> <method> <path>" on port 80 of p.
func httpServer(t *testing.T, p *pod) {
	t.Helper()
	var l net.Listener
	err := p.ns.Do(func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(p.ip, 80).String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s %s", p.name, r.Method, r.URL.Path)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

// client returns an HTTP client whose connections start in p's netns
// (an ordinary client: nothing names the proxy).
func (p *pod) client(timeout time.Duration, keepAlive bool) *http.Client {
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := p.ns.Do(func() (err error) {
			c, err = (&net.Dialer{Timeout: timeout}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DialContext: dial, DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 4}}
}

// request sends method path to dst:80 from p; the status code and body.
func (p *pod) request(dst *pod, method, path string, timeout time.Duration) (int, string, error) {
	req, err := http.NewRequest(method, "http://"+netip.AddrPortFrom(dst.ip, 80).String()+path, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := p.client(timeout, false).Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// importPolicy imports a YAML policy document.
func (n *node) importPolicy(doc string) uint64 {
	n.t.Helper()
	r, err := n.c.PolicyImport(context.Background(), []byte(doc), "application/yaml")
	if err != nil {
		n.t.Fatalf("import policy: %v", err)
	}
	return r.Revision
}

func (n *node) deletePolicy(name string) {
	n.t.Helper()
	if _, err := n.c.PolicyDelete(context.Background(), name); err != nil {
		n.t.Fatalf("delete policy %s: %v", name, err)
	}
}

// l7Acked waits until p's policy view shows L7 entries redirected in
// the policy map and its L7 configuration acknowledged by the proxy.
func (n *node) l7Acked(p *pod) *models.EndpointPolicy {
	n.t.Helper()
	var view *models.EndpointPolicy
	testutil.Eventually(n.t, fmt.Sprintf("pod %s's L7 policy realised and acknowledged", p.name), func() bool {
		v, err := n.c.EndpointPolicy(context.Background(), fmt.Sprint(p.ep.ID))
		if err != nil || len(v.ComputedL7) == 0 || v.L7Proxy == nil || !v.L7Proxy.Acked {
			return false
		}
		for _, e := range v.Realized {
			if e.ProxyPort != 0 {
				view = v
				return true
			}
		}
		return false
	})
	return view
}

// metric returns the value of the /metrics sample named by prefix (the
// metric name with its labels), -1 if absent.
func (n *node) metric(sample string) float64 {
	n.t.Helper()
	body := n.scrape()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err == nil {
				return f
			}
		}
	}
	return -1
}

func (n *node) scrape() string {
	n.t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
	}}}
	resp, err := hc.Get("http://agent/metrics")
	if err != nil {
		n.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// proxyRow is the L7 proxy's row of GET /v1/actors.
func (n *node) proxyRow() *models.Actor {
	n.t.Helper()
	rows, err := n.c.Actors(context.Background(), url.Values{"kind": {"l7-proxy"}})
	if err != nil {
		n.t.Fatal(err)
	}
	if len(rows) != 1 {
		n.t.Fatalf("GET /v1/actors?kind=l7-proxy: %d rows, want 1", len(rows))
	}
	return rows[0]
}
