package multinode

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// etcdHost is the underlay host number of the etcd netns (address .151).
const etcdHost = 150

// leaseTTL is every agent's --kvstore-lease-ttl in kvstore mode: short,
// so that the lease cases wait little; long enough that a loaded machine
// renews in time (the agent renews every TTL/3).
const leaseTTL = 5 * time.Second

// etcdProc is a real etcd process (etcd-embed: go.etcd.io/etcd/server/v3
// embed as a binary, built by scripts/kube-bin.sh) in a netns of its own
// attached to the underlay, so every node's agent reaches it over the
// underlay as it would reach an etcd cluster. Its data directory
// survives kill, so restart brings the same store back.
type etcdProc struct {
	c      *cluster
	bin    string
	ns     *testutil.NS
	addr   netip.Addr
	dir    string // data directory
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
	cli    *clientv3.Client // the test's own client, dialling inside ns
}

// etcdBinary finds etcd-embed where test/kubetest does; without it the
// test skips, unless CI is set (.ci/run builds it first).
func etcdBinary(t *testing.T) string {
	dir := os.Getenv("KUBETEST_BIN")
	if dir == "" {
		root := os.Getenv("KUBE_DIR")
		if root == "" {
			home, _ := os.UserHomeDir()
			root = filepath.Join(home, ".cache", "membrane", "kube-v1.35.4")
		}
		dir = filepath.Join(root, "bin")
	}
	bin := filepath.Join(dir, "etcd-embed")
	if _, err := os.Stat(bin); err != nil {
		if testutil.InCI() {
			t.Fatalf("etcd: %v (run scripts/kube-bin.sh)", err)
		}
		t.Skipf("etcd not built (run scripts/kube-bin.sh): %v", err)
	}
	return bin
}

// newKvCluster makes n nodes in routing mode whose agents run in kvstore
// mode against one etcd (no nodes file), and starts etcd and the agents.
// Every node's pods are on the same CNI network, so a label set is the
// same on every node.
func newKvCluster(t *testing.T, routing string, n int, netNum int) *cluster {
	t.Helper()
	return newKvClusterWith(t, routing, n, netNum, nil)
}

// newKvClusterWith is newKvCluster with c.defaults and setup (nil: none)
// run on the cluster before the agents start.
func newKvClusterWith(t *testing.T, routing string, n int, netNum int, setup func(c *cluster)) *cluster {
	t.Helper()
	return newKvClusterOpts(t, routing, n, netNum, setup != nil, setup)
}

// newKvClusterOpts is newKvCluster with c.defaults set to defaults and
// setup (nil: none) run on the cluster before the agents start.
func newKvClusterOpts(t *testing.T, routing string, n int, netNum int, defaults bool, setup func(c *cluster)) *cluster {
	t.Helper()
	testutil.RequireRoot(t)
	bin := etcdBinary(t)
	c := &cluster{t: t, net: netNum, routing: routing, dir: t.TempDir(), netName: fmt.Sprintf("mn-kv-%d", netNum), defaults: defaults}
	c.makeUnderlay()
	e := &etcdProc{c: c, bin: bin, dir: filepath.Join(c.dir, "etcd"), log: filepath.Join(c.dir, "etcd.log")}
	e.ns = c.attach("mbm-etcd", etcdHost, "eth0")
	e.addr, _ = c.underlayAddrs(etcdHost)
	t.Cleanup(e.stop) // before the netns goes, after the agents (registered later)
	if err := e.start(); err != nil {
		t.Fatal(err)
	}
	c.etcd = e
	for i := range n {
		c.nodes = append(c.nodes, c.newNode(i))
	}
	c.outside = c.attach("mbm-out", 199, "eth0")
	if setup != nil {
		setup(c)
	}
	c.startNodes()
	return c
}

// url is etcd's client URL on the underlay.
func (e *etcdProc) url() string { return "http://" + net.JoinHostPort(e.addr.String(), "2379") }

// agentArgs are nd's kvstore flags.
func (e *etcdProc) agentArgs(nd *node) []string {
	args := []string{"--kvstore", "etcd", "--etcd-endpoints", e.url(), "--node-name", nd.name, "--kvstore-lease-ttl", leaseTTL.String()}
	if nd.c.defaults {
		return args
	}
	return append(args, "--kvstore-node-addrs", nd.addr4.String()+","+nd.addr6.String())
}

// start starts etcd on its data directory inside its netns and waits
// (bounded) until it answers.
func (e *etcdProc) start() error {
	f, err := os.OpenFile(e.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(e.bin, "-data-dir", e.dir, "-listen-client", e.url(), "-listen-peer", "http://127.0.0.1:2380")
	cmd.Stdout, cmd.Stderr = f, f
	err = e.ns.Do(cmd.Start)
	f.Close()
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	e.cmd, e.exited = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(e.exited)
	if e.cli == nil {
		if e.cli, err = e.client(); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := e.cli.Get(ctx, "membrane-test-ready", clientv3.WithCountOnly())
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-e.exited:
			return fmt.Errorf("etcd exited during start: %v\n%s", err, e.tail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd not ready after 60 s: %v\n%s", err, e.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// client is the test's etcd client: its connections are made inside the
// etcd netns (the test process itself is not on the underlay).
func (e *etcdProc) client() (*clientv3.Client, error) {
	dial := func(ctx context.Context, addr string) (conn net.Conn, err error) {
		err = e.ns.Do(func() error {
			var d net.Dialer
			conn, err = d.DialContext(ctx, "tcp", addr)
			return err
		})
		return conn, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.url()}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithContextDialer(dial)}, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	e.c.t.Cleanup(func() { cli.Close() })
	return cli, nil
}

// kill SIGKILLs etcd and waits for it to exit.
func (e *etcdProc) kill() {
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Kill()
	<-e.exited
	e.cmd = nil
}

// stop ends etcd (SIGTERM, SIGKILL after 10 s); logs its tail on failure.
func (e *etcdProc) stop() {
	if e.cmd == nil {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		e.kill()
	}
	e.cmd = nil
	if e.c.t.Failed() {
		e.c.t.Logf("etcd log (tail):\n%s", e.tail())
	}
}

func (e *etcdProc) tail() string {
	data, _ := os.ReadFile(e.log)
	if len(data) > 8<<10 {
		data = data[len(data)-8<<10:]
	}
	return string(data)
}

// keys lists the keys (and values) under prefix (relative to the
// agents' default "membrane/" prefix).
func (e *etcdProc) keys(prefix string) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.cli.Get(ctx, "membrane/"+prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	out := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), "membrane/"+prefix)] = string(kv.Value)
	}
	return out, nil
}

// revoke revokes lease (a node removed by its operator: every key under
// it goes at once).
func (e *etcdProc) revoke(lease int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := e.cli.Revoke(ctx, leaseID(lease)); err != nil {
		return fmt.Errorf("revoke lease %x: %w", lease, err)
	}
	return nil
}

// leaseID is an agent's lease as GET /v1/status reports it.
func leaseID(lease int64) clientv3.LeaseID { return clientv3.LeaseID(lease) }
