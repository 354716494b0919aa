package k8s

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
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
	w.remote = newRemoteEndpoints(sys, w.log)
	nodeInf := all.Core().V1().Nodes()
	inf := nodeInf.Informer()
	// Nodes carry image lists and managed fields the agent never reads.
	if err := inf.SetTransform(slimNode); err != nil {
		return nil, err
	}
	w.nodes = &nodeWatch{self: w.cfg.NodeName, nodes: nodeInf.Lister(), sink: w.cfg.Nodes, inUse: validPrefixes(w.cfg.PodCIDRs),
		onAddr: w.eps.setNodeIP, log: w.log.With("worker", "nodes"), wake: make(chan struct{}, 1)}
	_, err = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: w.nodes.changed,
		UpdateFunc: func(_, n any) { w.nodes.changed(n) }, DeleteFunc: w.nodes.changed})
	return inf, err
}

// runWorkers starts the cluster workers; Stop waits for them.
func (w *Watcher) runWorkers(ctx context.Context, rc *rest.Config) {
	dyn, err := dynamic.NewForConfig(rc)
	w.workers.Add(3)
	go func() { defer w.workers.Done(); w.eps.run(ctx) }()
	go func() { defer w.workers.Done(); w.nodes.run(ctx) }()
	go func() {
		defer w.workers.Done()
		if err != nil {
			w.log.Error("remote endpoints not watched", "err", fmt.Errorf("dynamic client: %w", err))
			return
		}
		w.remote.run(ctx, dyn, w.cfg.NodeName)
	}()
}

func slimNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields, n.Status.Images, n.Annotations = nil, nil, nil
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
