package k8s

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// startClusterWatches builds what connects this agent to the rest of the
// cluster: the endpoint status writer, the remote endpoint mirror and the
// Node watch. The writer has its own client, rate limited to epWriteQPS.
func (w *Watcher) startClusterWatches(rc *rest.Config, all informers.SharedInformerFactory, sys *actors.System) (cache.SharedIndexInformer, error) {
	wrc := rest.CopyConfig(rc)
	wrc.QPS, wrc.Burst = epWriteQPS, epWriteBurst
	dyn, err := dynamic.NewForConfig(wrc)
	if err != nil {
		return nil, err
	}
	w.eps = newEndpointWriter(w.cfg.NodeName, dyn, sys.Index, sys.Events(), w.pods, w.log)
	nodeInf := all.Core().V1().Nodes()
	inf := nodeInf.Informer()
	cs, err := kubernetes.NewForConfig(wrc)
	if err != nil {
		return nil, err
	}
	w.health = &healthPublisher{node: w.cfg.NodeName, cs: cs, nodes: nodeInf.Lister(), ix: sys.Index, synced: inf.HasSynced,
		log: w.log.With("worker", "node-health-annotations")}
	w.remote = newRemoteEndpoints(sys, listerLookup(nodeInf.Lister()), w.log)
	w.nodesSynced = inf.HasSynced
	// Nodes carry image lists and managed fields the agent never reads.
	if err := inf.SetTransform(slimNode); err != nil {
		return nil, err
	}
	w.nodes = &nodeWatch{self: w.cfg.NodeName, nodes: nodeInf.Lister(), sink: w.cfg.Nodes, inUse: validPrefixes(w.cfg.PodCIDRs),
		onAddr: w.eps.setNodeIP, onLabels: sys.SetHostLabels, onNode: w.remote.nodeChanged, log: w.log.With("worker", "nodes"), wake: make(chan struct{}, 1)}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: w.nodes.changed,
		UpdateFunc: func(_, n any) { w.nodes.changed(n) }, DeleteFunc: w.nodes.changed})
	return inf, err
}

// runWorkers starts the cluster workers; Stop waits for them.
func (w *Watcher) runWorkers(ctx context.Context, rc *rest.Config) {
	dyn, err := dynamic.NewForConfig(rc)
	w.workers.Add(4)
	go func() { defer w.workers.Done(); w.eps.run(ctx) }()
	go func() { defer w.workers.Done(); w.health.run(ctx) }()
	go func() { defer w.workers.Done(); w.nodes.run(ctx) }()
	go func() {
		defer w.workers.Done()
		if err != nil {
			w.log.Error("remote endpoints not watched", "err", fmt.Errorf("dynamic client: %w", err))
			return
		}
		w.remote.run(ctx, dyn, w.cfg.NodeName, w.nodesSynced)
	}()
}

// listerLookup finds a node in the Node cache: the registry remote
// claims are checked against (endpoint.Remote.CheckOwner).
func listerLookup(l corelisters.NodeLister) nodeLookup {
	return func(name string) *endpoint.OwnerNode {
		n, err := l.Get(name)
		if err != nil {
			return nil
		}
		return ownerNode(n)
	}
}

// ownerNode is node as remote claims are checked against it: its pod
// CIDRs (as routed, PodCIDRs) and every InternalIP and ExternalIP.
func ownerNode(node *corev1.Node) *endpoint.OwnerNode {
	o := &endpoint.OwnerNode{Name: node.Name}
	v4, v6, _ := PodCIDRs(node) // a bad CIDR leaves the good ones
	for _, p := range []netip.Prefix{v4, v6} {
		if p.IsValid() {
			o.PodCIDRs = append(o.PodCIDRs, p)
		}
	}
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			o.Addrs = append(o.Addrs, ip.Unmap())
		}
	}
	return o
}

// slimNode drops what the agent never reads from a Node: its managed
// fields, images and annotations but the audit one (the host endpoint's
// audit mode, NodePolicyAudit) and the health endpoint's addresses
// (HealthIPs).
func slimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		kept := map[string]string{}
		for _, k := range []string{AuditAnnotation, HealthIPv4Annotation, HealthIPv6Annotation} {
			if v, has := n.Annotations[k]; has {
				kept[k] = v
			}
		}
		n.ManagedFields, n.Status.Images, n.Annotations = nil, nil, nil
		if len(kept) > 0 {
			n.Annotations = kept
		}
	}
	return obj, nil
}

func validPrefixes(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.IsValid() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// RefusedRemoteClaims counts the other nodes' MembraneEndpoints refused
// so far, by reason (one of endpoint.Refused*), each object once per
// reason; nil before the watches started.
func (w *Watcher) RefusedRemoteClaims() map[string]uint64 {
	if w.remote == nil {
		return nil
	}
	return w.remote.refused()
}

// RemoteEndpointsSynced is closed once the other nodes' endpoints first
// reached the ipcache as one replacement: until then the kernel's
// ipcache still holds what an earlier agent wrote for them, which a
// prune must not take away (Agent: the ipcache is pruned after this).
func (w *Watcher) RemoteEndpointsSynced() <-chan struct{} {
	if w.remote == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return w.remote.firstSync
}

// clusterStatus fills the status's cluster part.
func (w *Watcher) clusterStatus(st *models.K8sStatus) {
	st.RemoteEndpoints, st.RemoteEndpointsSynced = w.remote.stats()
	for _, p := range w.nodes.inUse {
		st.PodCIDRs = append(st.PodCIDRs, p.String())
	}
	w.nodes.mu.Lock()
	st.PodCIDRWarning, st.Nodes, st.NodeSyncError = w.nodes.cidrMismatch, w.nodes.synced, w.nodes.syncErr
	w.nodes.mu.Unlock()
	st.EndpointStatusQueue = w.eps.queue.Len()
}
