package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/kvstore"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// MultiConfig configures a multi-node run (membrane-sim --nodes N): N
// in-process agents on the fake datapath in kvstore mode, sharing one
// embedded etcd, each driving its own endpoints.
type MultiConfig struct {
	Nodes            int           // 2..200
	EndpointsPerNode int           // live endpoints each node keeps
	Duration         time.Duration // churn phase
	Crashes          int           // agent crash/restarts during the churn
	EtcdRestarts     int           // etcd stops and restarts during the churn
	LeaseTTL         time.Duration // node lease (default 2 s)
	Identities       int           // label sets endpoints draw from (default 16)
	Dir              string        // agents' sockets, state and etcd's data
	Log              *slog.Logger  // the agents' log (nil: discarded)
	Seed             uint64
}

// MultiReport is what a multi-node run did and found.
type MultiReport struct {
	Nodes            int    `json:"nodes"`
	EndpointsPerNode int    `json:"endpoints-per-node"`
	Creates          int    `json:"creates"`
	Deletes          int    `json:"deletes"`
	Errors           int    `json:"errors"` // failed requests (expected around crashes)
	FirstError       string `json:"first-error,omitempty"`
	// ErrorKinds counts failed requests by the start of their message.
	ErrorKinds   map[string]int    `json:"error-kinds,omitempty"`
	Crashes      int               `json:"crashes"`
	EtcdRestarts int               `json:"etcd-restarts"`
	Settle       time.Duration     `json:"settle-ns"` // churn end -> every invariant held
	PerNode      []MultiNodeReport `json:"per-node"`
	Violations   []string          `json:"violations"`
	// IdentityAgreement says that "one label set, one identity on every
	// node" was checked (violations are listed with the others).
	IdentityAgreement string `json:"identity-agreement"`
}

// MultiNodeReport is one node at the end.
type MultiNodeReport struct {
	Name          string `json:"name"`
	Endpoints     int    `json:"endpoints"`
	RemoteEntries int    `json:"remote-entries"`
	Published     int    `json:"published-keys"`
}

const simPrefix = "membrane-sim/"

// simNode is one node: its config, the running agent and a client.
type simNode struct {
	name string
	cfg  agent.Config
	// mu guards a, c and down.
	mu   sync.Mutex
	a    *agent.Agent
	c    *client.Client
	down bool
}

func (n *simNode) current() (*agent.Agent, *client.Client, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.a, n.c, !n.down
}

// RunMultiNode runs the multi-node scenario and checks its invariants.
func RunMultiNode(ctx context.Context, cfg MultiConfig) (*MultiReport, error) {
	if cfg.Nodes < 2 || cfg.Nodes > 200 {
		return nil, fmt.Errorf("--nodes: %d: want 2..200", cfg.Nodes)
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 2 * time.Second
	}
	if cfg.Identities <= 0 {
		cfg.Identities = 16
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	etcd, err := startSimEtcd(cfg.Dir)
	if err != nil {
		return nil, err
	}
	defer etcd.stop()
	nodes, err := startNodes(cfg, etcd.endpoint)
	defer stopNodes(nodes)
	if err != nil {
		return nil, err
	}
	rep := &MultiReport{Nodes: cfg.Nodes, EndpointsPerNode: cfg.EndpointsPerNode, IdentityAgreement: "checked"}
	churn(ctx, cfg, nodes, etcd, rep)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	start := time.Now()
	for {
		rep.Violations = checkNodes(ctx, cli, nodes, rep)
		if len(rep.Violations) == 0 || time.Since(start) > 60*time.Second || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep.Settle = time.Since(start)
	return rep, nil
}

func startNodes(cfg MultiConfig, etcdEndpoint string) ([]*simNode, error) {
	var nodes []*simNode
	for i := range cfg.Nodes {
		name := fmt.Sprintf("sim-node-%d", i)
		dir := filepath.Join(cfg.Dir, name)
		ac := agent.Config{Socket: filepath.Join(dir, "run", "a.sock"), StateDir: filepath.Join(dir, "state"),
			IPv4Range: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 220, byte(i), 0}), 24), Datapath: "fake",
			GCInterval: -1, GCPercent: agent.DefaultGCPercent, Fake: datapath.NewFake(cfg.Seed + uint64(i)),
			Kvstore:   &kvstore.Config{Endpoints: []string{etcdEndpoint}, NodeName: name, Prefix: simPrefix, LeaseTTL: cfg.LeaseTTL},
			NodeAddrs: []netip.Addr{netip.AddrFrom4([4]byte{192, 168, 220, byte(i + 1)})}}
		n := &simNode{name: name, cfg: ac}
		nodes = append(nodes, n)
		a, err := agent.Start(ac, cfg.Log.With("node", name))
		if err != nil {
			return nodes, fmt.Errorf("start %s: %w", name, err)
		}
		n.a, n.c = a, client.New(ac.Socket)
	}
	return nodes, nil
}

func stopNodes(nodes []*simNode) {
	for _, n := range nodes {
		a, c, _ := n.current()
		if a != nil {
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = a.Stop(ctx)
			cancel()
		}
	}
}

// churn ramps every node up to its endpoints and replaces them at random
// for the duration, while crashes and etcd restarts happen one after the
// other, spread over it (every one requested happens, the last ones after
// the churn if the earlier overran it).
func churn(ctx context.Context, cfg MultiConfig, nodes []*simNode, etcd *simEtcd, rep *MultiReport) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex // guards rep's counters
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := driveNode(ctx, cfg, i, n)
			c, d, e, first, kinds := r.creates, r.deletes, r.errs, r.first, r.kinds
			mu.Lock()
			if rep.ErrorKinds == nil {
				rep.ErrorKinds = map[string]int{}
			}
			for k, v := range kinds {
				rep.ErrorKinds[k] += v
			}
			rep.Creates, rep.Deletes, rep.Errors = rep.Creates+c, rep.Deletes+d, rep.Errors+e
			if rep.FirstError == "" && first != nil {
				rep.FirstError = first.Error()
			}
			mu.Unlock()
		}()
	}
	rnd := rand.New(rand.NewPCG(cfg.Seed, 7))
	faults := make([]int, 0, cfg.Crashes+cfg.EtcdRestarts) // 0: crash, 1: etcd
	for range cfg.Crashes {
		faults = append(faults, 0)
	}
	for range cfg.EtcdRestarts {
		faults = append(faults, 1)
	}
	rnd.Shuffle(len(faults), func(i, j int) { faults[i], faults[j] = faults[j], faults[i] })
	step := cfg.Duration / time.Duration(len(faults)+1)
	for _, f := range faults {
		sleepCtx(ctx, step) // a fault that overran the churn still happens
		if f == 0 {
			if crashNode(cfg, nodes[rnd.IntN(len(nodes))], time.Duration(rnd.Int64N(int64(2*cfg.LeaseTTL)))) == nil {
				rep.Crashes++
			}
		} else if etcd.restart(time.Duration(500+rnd.IntN(1500))*time.Millisecond) == nil {
			rep.EtcdRestarts++
		}
	}
	<-ctx.Done()
	wg.Wait()
}

// crashNode kills a node's agent (simulated SIGKILL) and restarts it on
// the same state after down.
func crashNode(cfg MultiConfig, n *simNode, down time.Duration) error {
	n.mu.Lock()
	n.down = true
	a, c := n.a, n.c
	n.mu.Unlock()
	c.Close()
	a.Crash()
	time.Sleep(down)
	a2, err := agent.Start(n.cfg, cfg.Log.With("node", n.name))
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.a = nil
		return fmt.Errorf("restart %s: %w", n.name, err)
	}
	n.a, n.c, n.down = a2, client.New(n.cfg.Socket), false
	return nil
}

// driveResult is what one node's driver did.
type driveResult struct {
	creates, deletes, errs int
	first                  error          // the first failed request
	kinds                  map[string]int // failed requests by message start
}

// driveNode keeps EndpointsPerNode endpoints on node i, replacing one at
// a time once there, until ctx ends.
func driveNode(ctx context.Context, cfg MultiConfig, i int, n *simNode) driveResult {
	rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+100))
	r := driveResult{kinds: map[string]int{}}
	fail := func(err error) {
		r.errs++
		r.first = cmp.Or(r.first, err)
		msg := err.Error()
		if j := strings.Index(msg, ": "); j > 0 && j < 40 {
			msg = msg[j+2:]
		}
		r.kinds[msg[:min(len(msg), 40)]]++
	}
	var live []int64
	seq := 0
	for ctx.Err() == nil {
		_, c, up := n.current()
		if !up {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if len(live) >= cfg.EndpointsPerNode {
			k := rnd.IntN(len(live))
			if err := c.EndpointDelete(rctx, fmt.Sprint(live[k])); err == nil {
				r.deletes++
			} else if ctx.Err() == nil {
				fail(err)
			}
			live = slices.Delete(live, k, k+1)
		}
		seq++
		pod := fmt.Sprintf("pod-%d", seq)
		id, err := createEndpoint(rctx, c, pod, fmt.Sprintf("k8s:app=app%d", rnd.IntN(cfg.Identities)))
		cancel()
		switch {
		case err == nil:
			live = append(live, id)
			r.creates++
		case ctx.Err() == nil: // else the churn ended mid-request
			fail(err)
		}
	}
	return r
}

func createEndpoint(ctx context.Context, c *client.Client, pod, label string) (int64, error) {
	ip, err := c.IPAMAllocate(ctx, "ipv4", "sim/"+pod)
	if err != nil {
		return 0, err
	}
	ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "sim-" + pod, K8sNamespace: "sim",
		K8sPodName: pod, Labels: []string{label}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		_ = c.IPAMRelease(ctx, ip.Address.IPv4)
		return 0, err
	}
	return ep.ID, nil
}

// checkNodes checks the cross-node invariants: one label set has one
// identity on every node; every node's ipcache holds
// exactly the other nodes' live endpoints from the kvstore, with the
// identity their node gave them, and etcd holds exactly each node's live
// endpoints (no entry outlives its endpoint).
func checkNodes(ctx context.Context, cli *clientv3.Client, nodes []*simNode, rep *MultiReport) []string {
	var v []string
	eps := make([]map[netip.Addr]identity.NumericIdentity, len(nodes))
	rep.PerNode = make([]MultiNodeReport, len(nodes))
	for i, n := range nodes {
		a, _, up := n.current()
		if !up || a == nil {
			return []string{n.name + ": agent not running"}
		}
		eps[i] = liveEndpoints(a.Index)
		rep.PerNode[i] = MultiNodeReport{Name: n.name, Endpoints: len(eps[i])}
	}
	// One label set, one identity, on every node.
	byLabels := map[string]identity.NumericIdentity{}
	for _, n := range nodes {
		a, _, _ := n.current()
		for _, ep := range a.Index.Endpoints(index.EndpointFilter{}) {
			if ep.Identity == 0 {
				continue
			}
			k := ep.Labels.Key()
			if id, ok := byLabels[k]; ok && id != ep.Identity {
				v = append(v, fmt.Sprintf("%s: %s is identity %d here, %d on another node", n.name, k, ep.Identity, id))
			}
			byLabels[k] = ep.Identity
		}
	}
	for i, n := range nodes {
		a, _, _ := n.current()
		want := map[netip.Addr]identity.NumericIdentity{}
		for j := range nodes {
			if j != i {
				maps.Copy(want, eps[j])
			}
		}
		got := remoteEntries(a.Index)
		rep.PerNode[i].RemoteEntries = len(got)
		v = append(v, diffRemote(n.name+" ipcache", want, got)...)
		published, err := etcdEndpoints(ctx, cli, n.name)
		if err != nil {
			return append(v, err.Error())
		}
		rep.PerNode[i].Published = len(published)
		v = append(v, diffRemote(n.name+" etcd", eps[i], published)...)
	}
	return v
}

// liveEndpoints are a node's endpoints that must be published: with an
// identity, not being deleted, with an address.
func liveEndpoints(ix *index.Index) map[netip.Addr]identity.NumericIdentity {
	out := map[netip.Addr]identity.NumericIdentity{}
	for _, ep := range ix.Endpoints(index.EndpointFilter{}) {
		if ep.Identity != 0 && ep.IPv4.IsValid() && ep.State != endpoint.StateDisconnecting && ep.State != endpoint.StateDisconnected {
			out[ep.IPv4] = ep.Identity
		}
	}
	return out
}

// remoteEntries are the ipcache's claims from the kvstore.
func remoteEntries(ix *index.Index) map[netip.Addr]identity.NumericIdentity {
	out := map[netip.Addr]identity.NumericIdentity{}
	for _, e := range ix.IPCache() {
		for _, c := range e.Claims {
			if c.Origin == kvstore.Source {
				out[e.Prefix.Addr()] = c.Identity
			}
		}
	}
	return out
}

func etcdEndpoints(ctx context.Context, cli *clientv3.Client, node string) (map[netip.Addr]identity.NumericIdentity, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, simPrefix+"state/endpoints/v1/"+node+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s's endpoints from etcd: %w", node, err)
	}
	out := map[netip.Addr]identity.NumericIdentity{}
	for _, kv := range resp.Kvs {
		var rec struct {
			IPs      []netip.Addr `json:"ips"`
			Identity uint32       `json:"identity"`
		}
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			return nil, errors.Join(fmt.Errorf("decode %s", kv.Key), err)
		}
		for _, ip := range rec.IPs {
			out[ip] = identity.NumericIdentity(rec.Identity)
		}
	}
	return out, nil
}

// diffRemote lists up to three differences between want and got.
func diffRemote(what string, want, got map[netip.Addr]identity.NumericIdentity) []string {
	var v []string
	for ip, id := range want {
		if g, ok := got[ip]; !ok {
			v = append(v, fmt.Sprintf("%s: %s (identity %d) missing", what, ip, id))
		} else if g != id {
			v = append(v, fmt.Sprintf("%s: %s has identity %d, want %d", what, ip, g, id))
		}
	}
	for ip := range got {
		if _, ok := want[ip]; !ok {
			v = append(v, fmt.Sprintf("%s: %s outlived its endpoint", what, ip))
		}
	}
	slices.Sort(v)
	if len(v) > 3 {
		v = append(v[:3], fmt.Sprintf("%s: and %d more", what, len(v)-3))
	}
	return v
}
