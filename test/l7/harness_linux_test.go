package l7

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// binDir holds membrane-cni and membrane-proxy, built once.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(testutil.RunWithBinaries(m, &binDir, "membrane-cni", "membrane-proxy"))
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
	host   *testutil.NS
	cni    *libcni.CNIConfig
	conf   *libcni.NetworkConfigList
	agent  *agent.Agent
	c      *client.Client
	socket string
	cfg    agent.Config
	logs   *testutil.LogBuffer
	pods   map[string]*pod
	mu     sync.Mutex
	events []events.Event
}

type pod struct {
	name string
	ns   *testutil.NS
	rt   *libcni.RuntimeConf
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
}

func newNode(t *testing.T, cidr string, o nodeOpts) *node {
	t.Helper()
	testutil.RequireRoot(t)
	if o.proxy == "" {
		o.proxy = filepath.Join(binDir, "membrane-proxy")
	}
	if o.pods == nil {
		o.pods = []string{"a", "b", "c"}
	}
	dir := t.TempDir()
	n := &node{t: t, host: testutil.NewNS(t, "mbt-l7"), logs: &testutil.LogBuffer{}, pods: map[string]*pod{}}
	socket, queue := filepath.Join(dir, "agent.sock"), filepath.Join(dir, "delete-queue")
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(dir, "cache"), exec)
	raw := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"membrane-l7","plugins":[{"type":"membrane-cni","socket":%q,"deleteQueueDir":%q}]}`,
		socket, queue)
	conf, err := libcni.NetworkConfFromBytes([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	n.conf = conf
	cfg := agent.Config{
		Socket: socket, StateDir: filepath.Join(dir, "state"), IPv4Range: netip.MustParsePrefix(cidr), Datapath: "linux",
		Linux: datapath.LinuxConfig{HostNetns: n.host.Path, BPFFS: testutil.BPFFSDir(t), TeardownDelay: -1,
			L7: datapath.L7Config{ProxyPath: o.proxy, XDSSocket: filepath.Join(dir, "xds.sock"), Listen: "127.0.0.1:15001",
				MinBackoff: 10 * time.Millisecond, MaxBackoff: 500 * time.Millisecond, StableAfter: time.Second}},
		DeleteQueueDir: queue, DeleteQueueInterval: time.Hour, GCInterval: time.Hour,
	}
	cfg.Actors.Endpoint.ProxyWaitTimeout = o.proxyWait
	n.cfg, n.socket = cfg, socket
	n.start()
	t.Cleanup(func() {
		n.stop()
		if t.Failed() {
			t.Logf("agent log:\n%s", n.logs.String())
		}
	})
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
	a, err := agent.Start(n.cfg, slog.New(slog.NewTextHandler(n.logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		n.t.Fatalf("start agent: %v", err)
	}
	n.agent, n.c = a, client.New(n.socket)
}

// stop stops the agent (gracefully: endpoints stay in the kernel).
func (n *node) stop() {
	n.t.Helper()
	n.c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.agent.Stop(ctx); err != nil {
		n.t.Errorf("stop agent: %v", err)
	}
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

// inHost runs fn on a thread in the node's netns (libcni execs the
// plugin there).
func (n *node) inHost(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return n.host.Do(func() error { return fn(ctx) })
}

// addPod runs CNI ADD for a pod labelled app=<name> in namespace
// default and deletes it (CNI DEL) when the test ends unless delPod did.
func (n *node) addPod(name string) *pod {
	n.t.Helper()
	p := &pod{name: name, ns: testutil.NewNS(n.t, "mbt-l7p")}
	id := "c" + testutil.RandomSuffix(24)
	p.rt = &libcni.RuntimeConf{ContainerID: id, NetNS: p.ns.Path, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", id}, {"K8S_POD_UID", "uid-" + name}}}
	var res *types100.Result
	err := n.inHost(func(ctx context.Context) error {
		r, err := n.cni.AddNetworkList(ctx, n.conf, p.rt)
		if err != nil {
			return err
		}
		res, err = types100.NewResultFromResult(r)
		return err
	})
	if err != nil {
		n.t.Fatalf("ADD %s: %v", name, err)
	}
	p.ip, _ = netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if p.ep, err = n.c.EndpointPatchLabels(context.Background(), "container-id:"+id, []string{"k8s:app=" + name}, nil); err != nil {
		n.t.Fatalf("label pod %s: %v", name, err)
	}
	n.pods[name] = p
	n.t.Cleanup(func() {
		if p.rt != nil {
			if err := n.delPod(p); err != nil {
				n.t.Errorf("DEL %s: %v", name, err)
			}
		}
	})
	return p
}

func (n *node) delPod(p *pod) error {
	err := n.inHost(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, n.conf, p.rt) })
	if err == nil {
		p.rt = nil
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
