package sim

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
// etcd (embedded, or a child process that its restarts SIGKILL), each
// driving its own endpoints.
type MultiConfig struct {
	Nodes            int           // 2..200
	EndpointsPerNode int           // live endpoints each node keeps
	Duration         time.Duration // churn phase
	Crashes          int           // agent crash/restarts during the churn
	EtcdRestarts     int           // etcd stops and restarts during the churn
	// EtcdBin runs etcd as a child process from this binary (etcd-embed
	// from scripts/kube-bin.sh, or etcd), restarted by SIGKILL; empty:
	// embedded in this process, restarted by a graceful stop.
	EtcdBin  string
	LeaseTTL time.Duration // node lease (default 2 s)
	// GCInterval and GCGrace are the nodes' identity GC (defaults 1 s and
	// 2 s): after the churn, the run waits for the GC to remove every
	// identity the drain left without a reference.
	GCInterval, GCGrace time.Duration
	// ProbeWait bounds the convergence probe after the churn (default
	// 30 s): a node not caught up with the churn by then is a violation.
	ProbeWait      time.Duration
	Identities     int // label sets endpoints draw from (default 16)
	WorkersPerNode int // concurrent drivers per node (default 4)
	// ChurnRate paces the replacements once a worker holds its endpoints:
	// lifecycles (a delete and a create) per second over all nodes; 0: as
	// fast as the agents answer.
	ChurnRate float64
	Dir       string       // agents' sockets, state and etcd's data
	Log       *slog.Logger // the agents' log (nil: discarded)
	Seed      uint64
}

// MultiReport is what a multi-node run did and found.
type MultiReport struct {
	Nodes            int `json:"nodes"`
	EndpointsPerNode int `json:"endpoints-per-node"`
	Creates          int `json:"creates"`
	Deletes          int `json:"deletes"`
	Errors           int `json:"errors"` // failed requests (expected around crashes)
	// TimedOut counts the failed requests that the simulator's client
	// gave up on (its 10 s deadline passed without an answer); Refused
	// those the agent answered 503 or 429 (busy, starting: retry later).
	// The rest of Errors are other failures (an agent down, an error).
	TimedOut   int    `json:"timed-out"`
	Refused    int    `json:"refused"`
	FirstError string `json:"first-error,omitempty"`
	// ErrorKinds counts failed requests by the start of their message.
	ErrorKinds   map[string]int `json:"error-kinds,omitempty"`
	Crashes      int            `json:"crashes"`
	EtcdRestarts int            `json:"etcd-restarts"`
	EtcdMode     string         `json:"etcd-mode"` // embedded (graceful restarts) or process (SIGKILL restarts)
	// Drained counts the endpoints deleted after the churn: every one of
	// the odd-numbered label sets, whose identities the GC must then
	// remove from etcd.
	Drained int `json:"drained"`
	// EtcdIdentities is how many identities etcd holds at the end.
	EtcdIdentities int           `json:"etcd-identities"`
	Settle         time.Duration `json:"settle-ns"` // drain end -> every invariant held
	// Convergence is each created endpoint's arrival in the other nodes'
	// ipcaches (their actor systems' index).
	Convergence *ConvergenceReport `json:"convergence"`
	PerNode     []MultiNodeReport  `json:"per-node"`
	Violations  []string           `json:"violations"`
	// IdentityAgreement says that "one label set, one identity on every
	// node" was checked (violations are listed with the others).
	IdentityAgreement string `json:"identity-agreement"`
	// StateFS is the filesystem of the agents' state directories (tmpfs,
	// as /run on a node, or a disk: every state change then waits for
	// fdatasync).
	StateFS string `json:"state-fs"`
	// Backlog is the nodes' kvstore mirrors' queues of remote endpoint
	// changes: how far behind etcd the ipcaches fell, at most (nil: the
	// run was cancelled before it was read).
	Backlog *MultiBacklog `json:"backlog,omitempty"`
	// Cost is the run's CPU, heap and etcd CPU, from the first endpoint
	// created until every node caught up with the churn (nil: the run was
	// cancelled).
	Cost *MultiCost `json:"cost,omitempty"`
}

// MultiNodeReport is one node at the end.
type MultiNodeReport struct {
	Name          string `json:"name"`
	Endpoints     int    `json:"endpoints"`
	RemoteEntries int    `json:"remote-entries"`
	Published     int    `json:"published-keys"`
	// Requests counts this node's driver's endpoint creates and deletes:
	// Creates and Deletes succeeded, Failures failed.
	Requests int `json:"requests"`
	Creates  int `json:"creates"`
	Deletes  int `json:"deletes"`
	Failures int `json:"failures"`
	TimedOut int `json:"timed-out"`
	Refused  int `json:"refused"`
	// MaxBehindSeconds and MaxPending are the largest backlog of remote
	// endpoint changes this node's mirror had (since its last start).
	MaxBehindSeconds float64 `json:"max-behind-seconds"`
	MaxPending       int     `json:"max-pending"`
	// ConvergenceP99MS is the p99 of other nodes' endpoints' arrival in
	// this node's ipcache.
	ConvergenceP99MS float64 `json:"convergence-p99-ms"`
}

const simPrefix = "membrane-sim/"

// MultiBacklog is the largest backlog of remote endpoint changes over the
// nodes (each node's since its last start): the degradation an agent that
// cannot keep up with the cluster's churn shows instead of failing calls.
type MultiBacklog struct {
	MaxBehindSeconds float64 `json:"max-behind-seconds"`
	MaxBehindNode    string  `json:"max-behind-node,omitempty"`
	MaxPending       int     `json:"max-pending"`
	// Coalesced counts, over the nodes, changes replaced by a later change
	// to the same address while queued; Applied the address changes handed
	// to the ipcaches.
	Coalesced uint64 `json:"coalesced"`
	Applied   uint64 `json:"applied"`
}

// readBacklog fills the report's backlog from every running node.
func readBacklog(nodes []*simNode, rep *MultiReport) {
	b := &MultiBacklog{}
	for i, n := range nodes {
		a, _, up := n.current()
		if !up || a == nil {
			continue
		}
		bl, ok := a.KvstoreBacklog()
		if !ok {
			continue
		}
		pn := &rep.PerNode[i]
		pn.MaxBehindSeconds, pn.MaxPending = bl.MaxBehind.Seconds(), bl.MaxPending
		if pn.MaxBehindSeconds > b.MaxBehindSeconds {
			b.MaxBehindSeconds, b.MaxBehindNode = pn.MaxBehindSeconds, n.name
		}
		b.MaxPending = max(b.MaxPending, bl.MaxPending)
		b.Coalesced += bl.Coalesced
		b.Applied += bl.Applied
	}
	rep.Backlog = b
}

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
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	etcd, err := startSimEtcd(cfg.Dir, cfg.EtcdBin)
	if err != nil {
		return nil, err
	}
	defer etcd.stop()
	conv := newConvTracker(cfg.Nodes, cfg.Nodes*min(cfg.WorkersPerNode, cfg.EndpointsPerNode))
	seenCtx, stopSeen := context.WithCancel(ctx)
	defer stopSeen()
	if err := watchSeen(seenCtx, etcd.endpoint(), simPrefix+"state/endpoints/v1/", conv); err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	nodes, err := startNodes(cfg, etcd.endpoint(), conv)
	defer stopNodes(nodes)
	if err != nil {
		return nil, err
	}
	heapBase := liveHeapAfterGC()
	rep := &MultiReport{Nodes: cfg.Nodes, EndpointsPerNode: cfg.EndpointsPerNode, IdentityAgreement: "checked", EtcdMode: "embedded",
		StateFS: fsType(cfg.Dir)}
	if cfg.EtcdBin != "" {
		rep.EtcdMode = "process " + cfg.EtcdBin + " (restarts: SIGKILL)"
	}
	r := &multiRun{cfg: cfg, nodes: nodes, etcd: etcd, rep: rep, conv: conv}
	start := takeCostSample(etcd.pid(), 0)
	live := r.churn(ctx)
	probeViolations := r.probe(ctx, live)
	if ctx.Err() == nil {
		// Every node holds every probe, or gave up waiting: either way the
		// churn's changes before them are applied, or as many as will be.
		end := takeCostSample(etcd.pid(), r.changes.Load())
		local := 0
		for _, l := range live {
			local += len(l)
		}
		rep.Cost = newMultiCost(cfg.Nodes, start, end, heapBase, liveHeapAfterGC(), local, rep.EtcdRestarts > 0)
		rep.Cost.CaughtUp = len(probeViolations) == 0
		rep.Cost.CatchUpSeconds = end.at.Sub(r.churnEnd).Seconds()
	}
	r.drain(ctx, live)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	settleStart := time.Now()
	for {
		rep.Violations = checkNodes(ctx, cli, nodes, rep)
		if len(rep.Violations) == 0 || time.Since(settleStart) > 60*time.Second || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	rep.Settle = time.Since(settleStart)
	if ctx.Err() == nil {
		readBacklog(nodes, rep)
	}
	rep.Violations = append(rep.Violations, probeViolations...)
	var p99 []float64
	rep.Convergence, p99 = r.conv.report()
	for i := range rep.PerNode {
		rep.PerNode[i].ConvergenceP99MS = p99[i]
	}
	return rep, nil
}

// maxEndpointsPerNode: each node's pod range is a /20.
const maxEndpointsPerNode = 4000

func (cfg MultiConfig) withDefaults() (MultiConfig, error) {
	if cfg.Nodes < 2 || cfg.Nodes > 200 {
		return cfg, fmt.Errorf("--nodes: %d: want 2..200", cfg.Nodes)
	}
	if cfg.EndpointsPerNode < 1 || cfg.EndpointsPerNode > maxEndpointsPerNode {
		return cfg, fmt.Errorf("--endpoints: %d per node: want 1..%d", cfg.EndpointsPerNode, maxEndpointsPerNode)
	}
	if cfg.Crashes < 0 || cfg.EtcdRestarts < 0 || cfg.Duration <= 0 || cfg.ChurnRate < 0 {
		return cfg, fmt.Errorf("crashes %d, etcd restarts %d, churn rate %g, duration %s: want them >= 0 and a positive duration",
			cfg.Crashes, cfg.EtcdRestarts, cfg.ChurnRate, cfg.Duration)
	}
	if cfg.EtcdBin != "" {
		if fi, err := os.Stat(cfg.EtcdBin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return cfg, fmt.Errorf("--etcd-bin: %q is not an executable file (scripts/kube-bin.sh builds etcd-embed)", cfg.EtcdBin)
		}
	}
	cfg.LeaseTTL = cmp.Or(cfg.LeaseTTL, 2*time.Second)
	cfg.GCInterval = cmp.Or(cfg.GCInterval, time.Second)
	cfg.GCGrace = cmp.Or(cfg.GCGrace, 2*time.Second)
	cfg.ProbeWait = cmp.Or(cfg.ProbeWait, 30*time.Second)
	if cfg.Identities <= 0 {
		cfg.Identities = 16
	}
	if cfg.WorkersPerNode <= 0 {
		cfg.WorkersPerNode = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return cfg, nil
}

// multiRun is one multi-node run in progress.
type multiRun struct {
	cfg   MultiConfig
	nodes []*simNode
	etcd  simEtcd
	conv  *convTracker
	// changes counts the endpoint creates and deletes answered.
	changes atomic.Int64
	// churnEnd is when the churn's drivers stopped.
	churnEnd time.Time
	// reqCtx bounds the drivers' requests: the run's context, not the
	// churn's, so that the churn's end lets the requests in flight finish
	// (a request cut at the churn's deadline is no timed-out call).
	reqCtx context.Context
	// mu guards rep's counters while the drivers run.
	mu  sync.Mutex
	rep *MultiReport
}

// podRange is node i's pod range: 10.128.0.0/9 cut into /20s.
func podRange(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + i/16), byte(i%16) << 4, 0}), 20)
}

func startNodes(cfg MultiConfig, etcdEndpoint string, conv *convTracker) ([]*simNode, error) {
	var nodes []*simNode
	for i := range cfg.Nodes {
		name := fmt.Sprintf("sim-node-%d", i)
		dir := filepath.Join(cfg.Dir, name)
		ac := agent.Config{Socket: filepath.Join(dir, "run", "a.sock"), StateDir: filepath.Join(dir, "state"),
			IPv4Range: podRange(i), Datapath: "fake", GCInterval: -1, GCPercent: agent.DefaultGCPercent,
			Fake: datapath.NewFake(cfg.Seed + uint64(i)),
			Kvstore: &kvstore.Config{Endpoints: []string{etcdEndpoint}, NodeName: name, Prefix: simPrefix, LeaseTTL: cfg.LeaseTTL,
				GCInterval: cfg.GCInterval, GCGrace: cfg.GCGrace, Trace: nodeTrace{t: conv, j: i}},
			NodeAddrs:       []netip.Addr{netip.AddrFrom4([4]byte{192, 168, byte(220 + i/250), byte(i%250 + 1)})},
			KvstoreObserver: func(eps []endpoint.Remote) { conv.observe(i, eps) }}
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
// the churn if the earlier overran it). It returns each node's live
// endpoints.
func (r *multiRun) churn(ctx context.Context) [][]liveEP {
	cfg, nodes := r.cfg, r.nodes
	r.reqCtx = ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var wg sync.WaitGroup
	r.rep.PerNode = make([]MultiNodeReport, len(nodes))
	live := make([][]liveEP, len(nodes))
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := r.driveNode(ctx, i, n)
			live[i] = d.live
			r.account(i, d)
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
			if r.crashNode(rnd.IntN(len(nodes)), time.Duration(rnd.Int64N(int64(2*cfg.LeaseTTL)))) == nil {
				r.rep.Crashes++
			}
		} else if r.etcd.restart(time.Duration(500+rnd.IntN(1500))*time.Millisecond) == nil {
			r.rep.EtcdRestarts++
		}
	}
	<-ctx.Done()
	wg.Wait()
	r.churnEnd = time.Now()
	return live
}

// account adds a driver's counts to the report.
func (r *multiRun) account(i int, d driveResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := r.rep
	if rep.ErrorKinds == nil {
		rep.ErrorKinds = map[string]int{}
	}
	for k, v := range d.kinds {
		rep.ErrorKinds[k] += v
	}
	rep.Creates, rep.Deletes, rep.Errors = rep.Creates+d.creates, rep.Deletes+d.deletes, rep.Errors+d.errs
	rep.TimedOut, rep.Refused = rep.TimedOut+d.timedOut, rep.Refused+d.refused
	pn := &rep.PerNode[i]
	pn.Creates, pn.Deletes, pn.Failures = pn.Creates+d.creates, pn.Deletes+d.deletes, pn.Failures+d.errs
	pn.TimedOut, pn.Refused = pn.TimedOut+d.timedOut, pn.Refused+d.refused
	pn.Requests = pn.Creates + pn.Deletes + pn.Failures
	if rep.FirstError == "" && d.first != nil {
		rep.FirstError = d.first.Error()
	}
}

// drain deletes, on every node, the endpoints of the odd-numbered label
// sets: their identities lose every reference, and the GC must remove
// them.
func (r *multiRun) drain(ctx context.Context, live [][]liveEP) {
	var wg sync.WaitGroup
	for i, n := range r.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := driveResult{kinds: map[string]int{}}
			for _, ep := range live[i] {
				if ep.set%2 == 0 || ctx.Err() != nil {
					continue
				}
				r.conv.deleted(ep.ip)
				_, c, up := n.current()
				if !up {
					d.fail(fmt.Errorf("drain: %s is down", n.name))
					continue
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				if err := c.EndpointDelete(rctx, fmt.Sprint(ep.id)); err != nil {
					d.fail(err)
				} else {
					d.deletes++
				}
				cancel()
			}
			r.account(i, d)
			r.mu.Lock()
			r.rep.Drained += d.deletes
			r.mu.Unlock()
		}()
	}
	wg.Wait()
}

// crashNode kills node j's agent (simulated SIGKILL) and restarts it on
// the same state after down.
func (r *multiRun) crashNode(j int, down time.Duration) error {
	n := r.nodes[j]
	r.conv.nodeDown(j)
	defer r.conv.nodeUp(j)
	n.mu.Lock()
	n.down = true
	a, c := n.a, n.c
	n.mu.Unlock()
	c.Close()
	a.Crash()
	time.Sleep(down)
	a2, err := agent.Start(n.cfg, r.cfg.Log.With("node", n.name))
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.a = nil
		return fmt.Errorf("restart %s: %w", n.name, err)
	}
	n.a, n.c, n.down = a2, client.New(n.cfg.Socket), false
	return nil
}

// liveEP is an endpoint a driver created and has not deleted.
type liveEP struct {
	id  int64
	ip  netip.Addr
	set int // its label set: k8s:app=app<set>
}

// driveResult is what one node's driver did.
type driveResult struct {
	creates, deletes, errs int
	timedOut, refused      int            // of errs: the client gave up; the agent said busy
	first                  error          // the first failed request
	kinds                  map[string]int // failed requests by message start
	live                   []liveEP
}

func (r *driveResult) fail(err error) {
	r.errs++
	switch failureKind(err) {
	case failTimedOut:
		r.timedOut++
	case failRefused:
		r.refused++
	}
	r.first = cmp.Or(r.first, err)
	msg := err.Error()
	if j := strings.Index(msg, ": "); j > 0 && j < 40 {
		msg = msg[j+2:]
	}
	if len(msg) > 100 { // the start says what, the end why
		msg = msg[:40] + " … " + msg[len(msg)-57:]
	}
	r.kinds[msg]++
}

// driveNode keeps EndpointsPerNode endpoints on node i with
// WorkersPerNode workers (each its share), replacing one at a time once
// there, until ctx ends.
func (r *multiRun) driveNode(ctx context.Context, i int, n *simNode) driveResult {
	cfg := r.cfg
	workers := min(cfg.WorkersPerNode, cfg.EndpointsPerNode)
	results := make([]driveResult, workers)
	var wg sync.WaitGroup
	for w := range workers {
		share := cfg.EndpointsPerNode / workers
		if w < cfg.EndpointsPerNode%workers {
			share++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[w] = r.driveWorker(ctx, i, w, share, n)
		}()
	}
	wg.Wait()
	d := driveResult{kinds: map[string]int{}}
	for _, w := range results {
		d.creates, d.deletes, d.errs = d.creates+w.creates, d.deletes+w.deletes, d.errs+w.errs
		d.first = cmp.Or(d.first, w.first)
		for k, v := range w.kinds {
			d.kinds[k] += v
		}
		d.timedOut, d.refused = d.timedOut+w.timedOut, d.refused+w.refused
		d.live = append(d.live, w.live...)
	}
	return d
}

// driveWorker is worker w of node i: it keeps share endpoints.
func (r *multiRun) driveWorker(ctx context.Context, i, w, share int, n *simNode) driveResult {
	cfg := r.cfg
	rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(i)<<16|uint64(w)+100))
	d := driveResult{kinds: map[string]int{}}
	seq, full := 0, false
	var pace time.Duration // between two lifecycles of this worker
	if cfg.ChurnRate > 0 {
		pace = time.Duration(float64(time.Second) * float64(cfg.Nodes*min(cfg.WorkersPerNode, cfg.EndpointsPerNode)) / cfg.ChurnRate)
	}
	var next time.Time
	for ctx.Err() == nil {
		_, c, up := n.current()
		if !up {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if len(d.live) >= share && !full {
			full, next = true, time.Now()
			r.conv.workerFull()
		}
		if full && pace > 0 {
			next = next.Add(pace)
			sleepCtx(ctx, time.Until(next))
			if ctx.Err() != nil {
				break
			}
		}
		rctx, cancel := context.WithTimeout(r.reqCtx, 10*time.Second)
		if len(d.live) >= share {
			k := rnd.IntN(len(d.live))
			r.conv.deleted(d.live[k].ip)
			if err := c.EndpointDelete(rctx, fmt.Sprint(d.live[k].id)); err == nil {
				d.deletes++
				r.changes.Add(1)
			} else if r.reqCtx.Err() == nil {
				d.fail(err)
			}
			d.live = slices.Delete(d.live, k, k+1)
		}
		seq++
		pod, set := fmt.Sprintf("pod-%d-%d", w, seq), rnd.IntN(cfg.Identities)
		ep, err := createEndpoint(rctx, c, pod, fmt.Sprintf("k8s:app=app%d", set), r.conv)
		cancel()
		switch {
		case err == nil:
			ip, _ := netip.ParseAddr(ep.Addressing.IPv4)
			if ep.Identity != nil && ep.Identity.ID > 0 {
				r.conv.created(i, ip, identity.NumericIdentity(ep.Identity.ID), time.Now())
			}
			d.live = append(d.live, liveEP{id: ep.ID, ip: ip, set: set})
			d.creates++
			r.changes.Add(1)
		case r.reqCtx.Err() == nil: // else the run was interrupted
			d.fail(err)
			sleepCtx(ctx, 20*time.Millisecond) // a failing agent is not hammered
		}
	}
	return d
}

// Failure kinds of a request (failureKind).
const (
	failOther    = iota
	failTimedOut // the client's deadline passed without an answer
	failRefused  // the agent answered 503 or 429: busy or starting, retry
)

// failureKind tells a request the client gave up on from one the agent
// refused and from any other failure.
func failureKind(err error) int {
	var ae *client.APIError
	var ne net.Error
	switch {
	case errors.As(err, &ae) && (ae.Status == http.StatusServiceUnavailable || ae.Status == http.StatusTooManyRequests):
		return failRefused
	case errors.As(err, &ae):
		return failOther
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return failTimedOut
	}
	return failOther
}

func createEndpoint(ctx context.Context, c *client.Client, pod, label string, conv *convTracker) (*models.Endpoint, error) {
	ip, err := c.IPAMAllocate(ctx, "ipv4", "sim/"+pod)
	if err != nil {
		return nil, err
	}
	addr, err := netip.ParseAddr(ip.Address.IPv4)
	if err != nil {
		return nil, fmt.Errorf("IPAM answered address %q: %w", ip.Address.IPv4, err)
	}
	conv.creating(addr)
	ep, err := c.EndpointCreate(ctx, "0", &models.EndpointChangeRequest{ContainerID: "sim-" + pod, K8sNamespace: "sim",
		K8sPodName: pod, Labels: []string{label}, Addressing: &models.AddressPair{IPv4: ip.Address.IPv4}, SyncBuild: true})
	if err != nil {
		conv.failed(addr)
		_ = c.IPAMRelease(ctx, ip.Address.IPv4)
		return nil, err
	}
	if ep.Addressing == nil || ep.Addressing.IPv4 == "" {
		ep.Addressing = &models.AddressPair{IPv4: ip.Address.IPv4}
	}
	return ep, nil
}

// checkNodes checks the cross-node invariants: one label set has one
// identity on every node; every node's ipcache holds
// exactly the other nodes' live endpoints from the kvstore, with the
// identity their node gave them, and etcd holds exactly each node's live
// endpoints (no entry outlives its endpoint).
func checkNodes(ctx context.Context, cli *clientv3.Client, nodes []*simNode, rep *MultiReport) []string {
	var v []string
	eps := make([]map[netip.Addr]identity.NumericIdentity, len(nodes))
	used := map[string]map[string]identity.NumericIdentity{} // node -> labels key -> identity of its live endpoints
	states := map[string]map[string][]string{}               // node -> labels key -> its endpoints' states (for messages)
	for i, n := range nodes {
		a, _, up := n.current()
		if !up || a == nil {
			return []string{n.name + ": agent not running"}
		}
		eps[i] = liveEndpoints(a.Index)
		used[n.name] = usedIdentities(a.Index)
		states[n.name] = identityStates(a.Index)
		rep.PerNode[i].Name, rep.PerNode[i].Endpoints = n.name, len(eps[i])
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
		v = append(v, strayEndpoints(n.name, a.Index, eps[i], published)...)
	}
	iv, count, err := checkEtcdIdentities(ctx, cli, used, states)
	if err != nil {
		return append(v, err.Error())
	}
	rep.EtcdIdentities = count
	return append(v, iv...)
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

// usedIdentities maps the labels key of each identity a node's live
// endpoints hold to its number.
func usedIdentities(ix *index.Index) map[string]identity.NumericIdentity {
	out := map[string]identity.NumericIdentity{}
	for _, ep := range ix.Endpoints(index.EndpointFilter{}) {
		if ep.Identity == 0 || ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
			continue
		}
		if id, ok := ix.Identity(ep.Identity); ok {
			out[id.Key] = ep.Identity
		}
	}
	return out
}

// identityStates lists, per labels key, the states of a node's endpoints
// holding that identity (whatever their state).
func identityStates(ix *index.Index) map[string][]string {
	out := map[string][]string{}
	for _, ep := range ix.Endpoints(index.EndpointFilter{}) {
		if id, ok := ix.Identity(ep.Identity); ok && ep.Identity != 0 {
			out[id.Key] = append(out[id.Key], fmt.Sprintf("%d:%s", ep.ID, ep.State))
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

// strayEndpoints says, for up to three addresses etcd holds for a node
// that does not hold them live, what its index holds there (the detail
// of diffRemote's "outlived" for the etcd side).
func strayEndpoints(node string, ix *index.Index, live, published map[netip.Addr]identity.NumericIdentity) []string {
	var v []string
	for ip := range published {
		if _, ok := live[ip]; ok || len(v) == 3 {
			continue
		}
		if ep, ok := ix.EndpointByIP(ip); ok {
			v = append(v, fmt.Sprintf("%s etcd: %s is endpoint %d in its index: state %s, identity %d", node, ip, ep.ID, ep.State, ep.Identity))
		} else {
			v = append(v, fmt.Sprintf("%s etcd: %s is no endpoint in its index", node, ip))
		}
	}
	return v
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
