package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// RemoteSource is the source name under which the Kubernetes endpoint
// objects of other nodes enter the ipcache.
const RemoteSource = "k8s"

// RemoteSink takes the endpoints of other nodes (*actors.System is one).
type RemoteSink interface {
	UpsertRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error
	DeleteRemoteEndpoints(ctx context.Context, source string, ips []netip.Addr) error
	ReplaceRemoteEndpoints(ctx context.Context, source string, eps []endpoint.Remote) error
}

// remoteRetryMax bounds the backoff of a failed sink call.
const remoteRetryMax = 30 * time.Second

// slimEndpoint is what the agent keeps of another node's MembraneEndpoint:
// no metadata beyond its key and owning node, no state.
type slimEndpoint struct {
	ips      []netip.Addr
	identity identity.NumericIdentity
	// refused is why the claim is not believed (0 when it is), the
	// reason last logged for the object.
	refused refusal
	// mismatch: status.networking.nodeName names another node than the
	// label.
	mismatch bool
	// node is the owning node: the object's membrane.io/node label ("" without
	// one), interned.
	node   string
	nodeIP netip.Addr
	// ports are the endpoint's named ports (nil when it declares none
	// or the object's list is invalid, which is logged).
	ports policy.NamedPorts
}

// refusal is a refusal reason as a slimEndpoint keeps it (one byte, not a
// string: there is one per remote endpoint).
type refusal uint8

// refusalPending: the node registry is not listed yet (not logged).
const refusalPending refusal = 1

// refusalReasons are the reasons by refusal (0: accepted).
var refusalReasons = []string{"", "pending", endpoint.RefusedNoOwner, endpoint.RefusedUnknownNode,
	endpoint.RefusedOutsideNode, endpoint.RefusedNodeIP, endpoint.RefusedReserved}

func refusalOf(reason string) refusal {
	for i, r := range refusalReasons {
		if r == reason {
			return refusal(i)
		}
	}
	return refusal(len(refusalReasons)) // unknown: still refused
}

func (f refusal) String() string {
	if int(f) < len(refusalReasons) {
		return refusalReasons[f]
	}
	return "refused"
}

// nodeLookup finds a node of the registry (the Node objects) by name; nil
// when there is none.
type nodeLookup func(name string) *endpoint.OwnerNode

// remoteEndpoints mirrors the MembraneEndpoints of other nodes into a
// RemoteSink. It is the store of a client-go reflector (list + watch with
// relists after errors): the store converts each object to a
// slimEndpoint at once (the informer's transform), so only that is kept.
// The reflector's calls never wait for the sink: they mark keys dirty and
// wake the one worker, which hands the sink bounded batches. A relist
// (Replace, the first one at start) makes the next round a full
// ReplaceRemoteEndpoints; later ones are upserts and deletes.
//
// A claim reaches the sink only while the node its label names is a
// known Node whose pod CIDRs hold every claimed address and whose
// addresses include the claimed node IP, and its identity is not a
// reserved one (endpoint.Remote.CheckOwner). Refused objects are kept,
// logged once per reason and counted, and checked again whenever their
// node changes: a claim that arrives before its Node is accepted when
// the Node appears, and one whose node loses the CIDR is withdrawn.
type remoteEndpoints struct {
	sink   RemoteSink
	lookup nodeLookup // nil: no node is known, every claim is refused
	log    *slog.Logger
	wake   chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// objs are the current objects by "namespace/name" (refused ones
	// too); owners maps each address to the key of the accepted object
	// that claims it; byNode indexes objs by owning node.
	objs   map[string]*slimEndpoint
	owners map[netip.Addr]string
	byNode map[string]map[string]struct{}
	// refusals counts refused claims by reason (each object once per
	// reason it was refused for).
	refusals map[string]uint64
	// dirty are the keys changed since the last round; gone the
	// addresses no object claims any more; full asks for a replacement.
	dirty  map[string]struct{}
	gone   map[netip.Addr]struct{}
	full   bool
	synced bool // the first replacement reached the sink
	// firstSync is closed once it did (Watcher.RemoteEndpointsSynced).
	firstSync chan struct{}
	// ready is set once the node registry is listed: before, every claim
	// is pending and nothing reaches the sink.
	ready bool
	nodes map[string]string
}

var _ cache.TransformingStore = (*remoteEndpoints)(nil)

// slimObject is what the reflector's own stores hold of an object while
// it streams the initial list (watch-list): the store's key and the
// slimEndpoint, computed as each object arrives. Without it the
// reflector kept every object of the list whole until the list ended
// (5,000 objects: tens of MiB of maps, a heap goal three times that).
type slimObject struct {
	key string
	ep  *slimEndpoint
	ok  bool
}

// Transformer implements cache.TransformingStore: the reflector applies
// it to the objects it holds before Replace (the watch-list's temporary
// store); Add, Update and Delete still get the objects as they came.
func (r *remoteEndpoints) Transformer() cache.TransformFunc {
	return func(obj any) (any, error) {
		if _, isU := obj.(*unstructured.Unstructured); !isU {
			return obj, nil
		}
		r.mu.Lock()
		key, ep, ok := r.slim(obj)
		r.mu.Unlock()
		return &slimObject{key: key, ep: ep, ok: ok}, nil
	}
}

func newRemoteEndpoints(sink RemoteSink, lookup nodeLookup, log *slog.Logger) *remoteEndpoints {
	return &remoteEndpoints{sink: sink, lookup: lookup, log: log.With("worker", "remote-endpoints"), wake: make(chan struct{}, 1),
		firstSync: make(chan struct{}),
		objs:      map[string]*slimEndpoint{}, owners: map[netip.Addr]string{}, byNode: map[string]map[string]struct{}{},
		refusals: map[string]uint64{}, dirty: map[string]struct{}{}, gone: map[netip.Addr]struct{}{}, nodes: map[string]string{},
		ready: true}
}

// remoteSelector selects the other nodes' objects: those with a node
// label that names another node (an object without the label is no
// node's and claims nothing).
func remoteSelector(self string) string {
	return v2.EndpointNodeLabel + "," + v2.EndpointNodeLabel + "!=" + self
}

// run lists and watches the other nodes' objects and feeds the sink until
// ctx ends. The objects are listed at once; their claims are checked
// (and the sink fed) once nodesSynced (nil: at once) reports the node
// registry listed, so no claim is refused for a node not listed yet.
func (r *remoteEndpoints) run(ctx context.Context, dyn dynamic.Interface, node string, nodesSynced cache.InformerSynced) {
	if nodesSynced != nil {
		r.mu.Lock()
		r.ready = false
		r.mu.Unlock()
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), nodesSynced) {
				r.nodesReady()
			}
		}()
	}
	sel := remoteSelector(node)
	res := dyn.Resource(endpointsGVR)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = sel
			return res.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = sel
			return res.Watch(ctx, o)
		},
	}
	refl := cache.NewReflectorWithOptions(lw, &unstructured.Unstructured{}, r, cache.ReflectorOptions{Name: "membrane-remote-endpoints"})
	go refl.RunWithContext(ctx)
	r.work(ctx)
}

// slim is the transform: the object's key and what the ipcache needs.
// ok is false for an object that claims nothing (no identity or address).
// Called with mu held.
func (r *remoteEndpoints) slim(obj any) (key string, ep *slimEndpoint, ok bool) {
	if d, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
		return d.Key, nil, false
	}
	if o, isSlim := obj.(*slimObject); isSlim {
		return o.key, o.ep, o.ok
	}
	u, isU := obj.(*unstructured.Unstructured)
	if !isU {
		return "", nil, false
	}
	key = u.GetNamespace() + "/" + u.GetName()
	id, _, _ := unstructured.NestedInt64(u.Object, "status", "identity", "id")
	ep = &slimEndpoint{identity: identity.NumericIdentity(id)}
	for _, f := range []string{"ipv4", "ipv6"} {
		s, _, _ := unstructured.NestedString(u.Object, "status", "networking", f)
		if a, err := netip.ParseAddr(s); err == nil && !a.IsUnspecified() {
			ep.ips = append(ep.ips, a.Unmap())
		}
	}
	name, _, _ := unstructured.NestedString(u.Object, "status", "networking", "nodeName")
	ip, _, _ := unstructured.NestedString(u.Object, "status", "networking", "nodeIP")
	ep.nodeIP, _ = netip.ParseAddr(ip)
	ep.nodeIP = ep.nodeIP.Unmap()
	ep.node = r.intern(u.GetLabels()[v2.EndpointNodeLabel])
	ep.mismatch = name != "" && name != ep.node
	if raw, found, _ := unstructured.NestedSlice(u.Object, "status", "namedPorts"); found {
		ports, err := slimPorts(raw)
		if err != nil {
			r.log.Warn("remote endpoint's named ports left out", "object", key, "err", err)
		}
		ep.ports = ports
	}
	return key, ep, id > 0 && id <= int64(^uint32(0)) && len(ep.ips) > 0
}

// slimPorts validates a MembraneEndpoint's status.namedPorts.
func slimPorts(raw []any) (policy.NamedPorts, error) {
	ps := make([]policy.NamedPort, 0, len(raw))
	for i, x := range raw {
		m, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("namedPorts[%d]: not an object", i)
		}
		name, _ := m["name"].(string)
		protoS, _ := m["protocol"].(string)
		port, ok := m["port"].(int64)
		if !ok || port < 1 || port > 65535 {
			return nil, fmt.Errorf("namedPorts[%d].port: not a number in 1..65535", i)
		}
		proto, err := policy.ParsePortProtocol(protoS)
		if err != nil {
			return nil, fmt.Errorf("namedPorts[%d]: %w", i, err)
		}
		ps = append(ps, policy.NamedPort{Name: name, Proto: proto, Port: uint16(port)})
	}
	return policy.NewNamedPorts(ps)
}

// nodeCache holds the nodes looked up during one call (a relist checks
// many objects of each node); nil: no caching.
type nodeCache map[string]*endpoint.OwnerNode

// node returns name's node from the registry (nil: unknown).
func (r *remoteEndpoints) node(name string, cache nodeCache) *endpoint.OwnerNode {
	if r.lookup == nil || name == "" {
		return nil
	}
	if cache == nil {
		return r.lookup(name)
	}
	n, ok := cache[name]
	if !ok {
		n = r.lookup(name)
		cache[name] = n
	}
	return n
}

// evalLocked checks ep's claim against its node and records the verdict
// in ep.refused; a refusal for a reason other than prev (the reason last
// logged for the object; 0 for a new or accepted one) is logged and
// counted, except that an object accepted before (wasAccepted) whose Node
// went away is withdrawn quietly (nodeChanged logs one line for the
// node). Until the node registry is listed every claim is pending (not
// logged). True when accepted.
func (r *remoteEndpoints) evalLocked(key string, ep *slimEndpoint, prev refusal, wasAccepted bool, cache nodeCache) bool {
	if !r.ready {
		ep.refused = refusalPending
		return false
	}
	var err error
	if ep.mismatch {
		err = &endpoint.RefusedError{Reason: endpoint.RefusedNoOwner, Detail: "status.networking.nodeName is not the node label's node " + ep.node}
	} else {
		rem := endpoint.Remote{IPs: ep.ips, Identity: ep.identity, Node: ep.node, NodeIP: ep.nodeIP}
		err = rem.CheckOwner(ep.node, r.node(ep.node, cache))
	}
	var re *endpoint.RefusedError
	if !errors.As(err, &re) {
		if prev > refusalPending {
			r.log.Info("remote endpoint accepted", "object", key, "node", ep.node, "refused-before", prev)
		}
		ep.refused = 0
		return true
	}
	ep.refused = refusalOf(re.Reason)
	if re.Reason == endpoint.RefusedUnknownNode && wasAccepted {
		return false
	}
	if ep.refused != prev {
		r.refusals[re.Reason]++
		r.log.Log(context.Background(), endpoint.RefusalLevel(re.Reason), "remote endpoint refused", "object", key, "node", ep.node, "reason", re.Reason, "detail", re.Detail)
	}
	return false
}

// addLocked records key's object and, if its claim is accepted, makes it
// the owner of its addresses.
func (r *remoteEndpoints) addLocked(key string, ep *slimEndpoint, prev refusal, wasAccepted bool, cache nodeCache) {
	r.objs[key] = ep
	keys := r.byNode[ep.node]
	if keys == nil {
		keys = map[string]struct{}{}
		r.byNode[ep.node] = keys
	}
	keys[key] = struct{}{}
	if r.evalLocked(key, ep, prev, wasAccepted, cache) {
		r.ownLocked(key, ep)
	}
}

func (r *remoteEndpoints) ownLocked(key string, ep *slimEndpoint) {
	for _, ip := range ep.ips {
		r.owners[ip] = key
		delete(r.gone, ip)
	}
}

// releaseLocked gives up the addresses key alone owns: they go.
func (r *remoteEndpoints) releaseLocked(key string, ep *slimEndpoint) {
	for _, ip := range ep.ips {
		if r.owners[ip] == key {
			delete(r.owners, ip)
			r.gone[ip] = struct{}{}
		}
	}
}

// nodesReady checks every claim held (all pending until now) and asks
// for a full replacement.
func (r *remoteEndpoints) nodesReady() {
	r.mu.Lock()
	r.ready = true
	cache := nodeCache{}
	for key, ep := range r.objs {
		if r.evalLocked(key, ep, ep.refused, false, cache) {
			r.ownLocked(key, ep)
		}
	}
	r.full = true
	r.mu.Unlock()
	r.signal()
}

// nodeChanged checks the claims of node's objects again (its Node
// appeared, changed or went): newly accepted ones are upserted, newly
// refused ones withdrawn.
func (r *remoteEndpoints) nodeChanged(node string) {
	r.mu.Lock()
	changed := false
	cache := nodeCache{}
	withdrawn := 0
	for key := range r.byNode[node] {
		ep := r.objs[key]
		was := ep.refused == 0
		now := r.evalLocked(key, ep, ep.refused, was, cache)
		if was && !now && ep.refused == refusalOf(endpoint.RefusedUnknownNode) {
			withdrawn++
		}
		switch {
		case now && !was:
			r.ownLocked(key, ep)
			r.dirty[key] = struct{}{}
			changed = true
		case !now && was:
			r.releaseLocked(key, ep)
			changed = true
		}
	}
	r.mu.Unlock()
	if withdrawn > 0 {
		r.log.Info("node gone: its remote endpoints withdrawn", "node", node, "endpoints", withdrawn)
	}
	if changed {
		r.signal()
	}
}

// intern shares node name strings between the endpoints of one node.
// Called with mu held.
func (r *remoteEndpoints) intern(s string) string {
	if v, ok := r.nodes[s]; ok {
		return v
	}
	r.nodes[s] = s
	return s
}

// Add implements cache.ReflectorStore.
func (r *remoteEndpoints) Add(obj any) error {
	r.mu.Lock()
	key, ep, ok := r.slim(obj)
	prev, wasAccepted := refusal(0), false
	if old := r.objs[key]; old != nil {
		prev, wasAccepted = old.refused, old.refused == 0
	}
	r.dropLocked(key)
	if ok {
		r.addLocked(key, ep, prev, wasAccepted, nil)
	}
	r.dirty[key] = struct{}{}
	r.mu.Unlock()
	r.signal()
	return nil
}

// Update implements cache.ReflectorStore.
func (r *remoteEndpoints) Update(obj any) error { return r.Add(obj) }

// Delete implements cache.ReflectorStore.
func (r *remoteEndpoints) Delete(obj any) error {
	r.mu.Lock()
	key, _, _ := r.slim(obj)
	r.dropLocked(key)
	delete(r.dirty, key)
	r.mu.Unlock()
	r.signal()
	return nil
}

// dropLocked forgets key's object; the addresses it alone claimed go.
func (r *remoteEndpoints) dropLocked(key string) {
	old := r.objs[key]
	if old == nil {
		return
	}
	delete(r.objs, key)
	if keys := r.byNode[old.node]; keys != nil {
		delete(keys, key)
		if len(keys) == 0 {
			delete(r.byNode, old.node)
		}
	}
	if old.refused == 0 {
		r.releaseLocked(key, old)
	}
}

// Replace implements cache.ReflectorStore: a (re)list.
func (r *remoteEndpoints) Replace(list []any, _ string) error {
	r.mu.Lock()
	old := r.objs
	r.objs = make(map[string]*slimEndpoint, len(list))
	r.owners = make(map[netip.Addr]string, len(list))
	r.byNode = map[string]map[string]struct{}{}
	cache := nodeCache{}
	for _, obj := range list {
		if key, ep, ok := r.slim(obj); ok {
			prev, wasAccepted := refusal(0), false
			if o := old[key]; o != nil {
				prev, wasAccepted = o.refused, o.refused == 0
			}
			r.addLocked(key, ep, prev, wasAccepted, cache)
		}
	}
	r.dirty, r.gone, r.full = map[string]struct{}{}, map[netip.Addr]struct{}{}, true
	r.mu.Unlock()
	r.signal()
	return nil
}

// Resync implements cache.ReflectorStore.
func (r *remoteEndpoints) Resync() error { return nil }

func (r *remoteEndpoints) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// work applies the changes in rounds until ctx ends; a failed round is
// retried with backoff.
func (r *remoteEndpoints) work(ctx context.Context) {
	var backoff time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
		if err := r.round(ctx); err != nil {
			backoff = min(max(2*backoff, 100*time.Millisecond), remoteRetryMax)
			r.log.Warn("remote endpoints not applied; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			r.signal()
			continue
		}
		backoff = 0
	}
}

// round hands the sink what changed since the last round. On failure the
// changes are put back (a newer change of a key wins).
func (r *remoteEndpoints) round(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	r.mu.Lock()
	if !r.ready {
		r.mu.Unlock()
		return nil // nodesReady asks again
	}
	full, dirty, gone := r.full, r.dirty, r.gone
	var ups []endpoint.Remote
	if full {
		ups = make([]endpoint.Remote, 0, len(r.objs))
		for _, ep := range r.objs {
			if ep.refused == 0 {
				ups = append(ups, ep.remote())
			}
		}
	} else {
		for k := range dirty {
			if ep := r.objs[k]; ep != nil && ep.refused == 0 {
				ups = append(ups, ep.remote())
			}
		}
	}
	r.full, r.dirty, r.gone = false, map[string]struct{}{}, map[netip.Addr]struct{}{}
	r.mu.Unlock()
	if full {
		start := time.Now()
		if err := r.sink.ReplaceRemoteEndpoints(ctx, RemoteSource, ups); err != nil {
			r.putBack(true, nil, nil)
			return err
		}
		r.mu.Lock()
		first := !r.synced
		r.synced = true
		r.mu.Unlock()
		if first {
			close(r.firstSync)
		}
		r.log.Info("remote endpoints replaced", "endpoints", len(ups), "took", time.Since(start), "first", first)
		return nil
	}
	del := make([]netip.Addr, 0, len(gone))
	for ip := range gone {
		del = append(del, ip)
	}
	if err := r.sink.DeleteRemoteEndpoints(ctx, RemoteSource, del); err != nil {
		r.putBack(false, dirty, gone)
		return err
	}
	if err := r.sink.UpsertRemoteEndpoints(ctx, RemoteSource, ups); err != nil {
		r.putBack(false, dirty, nil)
		return err
	}
	return nil
}

func (r *remoteEndpoints) putBack(full bool, dirty map[string]struct{}, gone map[netip.Addr]struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.full = r.full || full
	for k := range dirty {
		r.dirty[k] = struct{}{}
	}
	for ip := range gone {
		if _, claimed := r.owners[ip]; !claimed {
			r.gone[ip] = struct{}{}
		}
	}
}

func (ep *slimEndpoint) remote() endpoint.Remote {
	return endpoint.Remote{IPs: ep.ips, Identity: ep.identity, Node: ep.node, NodeIP: ep.nodeIP, NamedPorts: ep.ports}
}

// stats returns how many remote endpoints are held (refused ones too)
// and whether the first replacement reached the sink.
func (r *remoteEndpoints) stats() (n int, synced bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.objs), r.synced
}

// refused returns the refused claims counted so far, by reason.
func (r *remoteEndpoints) refused() map[string]uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.refusals)
}
