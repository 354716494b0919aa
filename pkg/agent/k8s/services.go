package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// ServiceSource is the service table's source name of the Kubernetes
// services.
const ServiceSource = "k8s"

// ServiceSink is where the service watcher writes (*actors.System).
type ServiceSink interface {
	ReplaceServices(ctx context.Context, source string, svcs []service.Service) (actors.ServiceResult, error)
	UpsertServices(ctx context.Context, source string, svcs []service.Service) (actors.ServiceResult, error)
	DeleteService(ctx context.Context, source string, frontends ...service.Frontend) (actors.ServiceResult, error)
	PruneServices()
	// SetPolicyService tells the policy repository a Service the
	// toServices rules resolve against (nil: gone).
	SetPolicyService(namespace, name string, svc *policy.Service)
	// SetKubeAPIServerAddrs gives the ipcache the API server's addresses.
	SetKubeAPIServerAddrs(addrs []netip.Addr)
	// SetKubeAPIServerPeers gives the host firewall's safety net the
	// API server's addresses and TCP ports.
	SetKubeAPIServerPeers(peers []netip.AddrPort)
}

// The API server's addresses are read from its own EndpointSlice only:
// the one it writes itself, default/kubernetes (not any slice labelled
// for the kubernetes Service, which whoever may write EndpointSlices in
// default could add).
const (
	apiServerNamespace = "default"
	apiServerSlice     = "kubernetes"
)

// syncAPIServer gives the ipcache the addresses of the API server's
// EndpointSlice, and the host firewall's safety net its addresses with
// each TCP port (none while it does not exist).
func (w *ServiceWatcher) syncAPIServer() {
	var addrs []netip.Addr
	var peers []netip.AddrPort
	if sl, err := w.slices.EndpointSlices(apiServerNamespace).Get(apiServerSlice); err == nil {
		for _, ep := range sl.Endpoints {
			addrs = append(addrs, parseAddrs(ep.Addresses)...)
		}
		for _, p := range sl.Ports {
			if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
				continue
			}
			for _, a := range addrs {
				peers = append(peers, netip.AddrPortFrom(a, uint16(*p.Port)))
			}
		}
	}
	w.sink.SetKubeAPIServerAddrs(addrs)
	w.sink.SetKubeAPIServerPeers(peers)
}

// ServiceWatcher feeds the service table from the Services and
// EndpointSlices of the API server (and this Node's addresses, for
// NodePort in kube-proxy replacement mode). Informer callbacks only queue
// service keys ("namespace/name"); one worker translates a service and
// writes its frontends, so repeated changes of one service collapse.
type ServiceWatcher struct {
	log    *slog.Logger
	sink   ServiceSink
	view   serviceView
	svcs   corelisters.ServiceLister
	slices discoverylisters.EndpointSliceLister
	nodes  corelisters.NodeLister
	synced []cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	// held is what the worker wrote per service key (worker only).
	held map[string][]service.Frontend
	// hc serves the health check node ports (nil: not this agent's job,
	// without the kube-proxy replacement).
	hc *healthChecks
}

// StartServices starts the Service, EndpointSlice and Node informers,
// waits for them (bounded by cfg.SyncTimeout), writes the full set
// (ReplaceServices) and prunes the maps of what an earlier agent left;
// then changes follow one service at a time. After a sync timeout the
// full set is written once the caches sync, in the background.
func StartServices(ctx context.Context, cfg Config, sink ServiceSink, log *slog.Logger) (*ServiceWatcher, error) {
	_, client, err := cfg.clientset("start k8s service watcher")
	if err != nil {
		return nil, err
	}
	w := &ServiceWatcher{log: log.With("component", "k8s-services", "node", cfg.NodeName), sink: sink,
		view: serviceView{node: cfg.NodeName, replacement: cfg.KubeProxyReplacement}, done: make(chan struct{}),
		held: map[string][]service.Frontend{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "membrane-k8s-services"})}
	if cfg.KubeProxyReplacement && cfg.HealthCheckNodePorts {
		w.hc = newHealthChecks(cfg.HealthCheckListen, w.log)
	}
	all := informers.NewSharedInformerFactory(client, 0)
	node := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.NodeName).String()
	}))
	svcInf, sliceInf, nodeInf := all.Core().V1().Services(), all.Discovery().V1().EndpointSlices(), node.Core().V1().Nodes()
	w.svcs, w.slices, w.nodes = svcInf.Lister(), sliceInf.Lister(), nodeInf.Lister()
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{{svcInf.Informer(), w.serviceChanged}, {sliceInf.Informer(), w.sliceChanged}, {nodeInf.Informer(), w.nodeChanged}} {
		fn := h.fn
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: fn, UpdateFunc: func(_, n any) { fn(n) }, DeleteFunc: fn}); err != nil {
			return nil, fmt.Errorf("start k8s service watcher: %w", err)
		}
		w.synced = append(w.synced, h.inf.HasSynced)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	all.Start(runCtx.Done())
	node.Start(runCtx.Done())
	go func() {
		<-runCtx.Done()
		w.queue.ShutDown()
		all.Shutdown()
		node.Shutdown()
	}()
	syncCtx, stop := context.WithTimeout(ctx, cfg.syncTimeout())
	defer stop()
	if cache.WaitForCacheSync(syncCtx.Done(), w.synced...) {
		w.fullSync(syncCtx)
		go w.run(runCtx)
		return w, nil
	}
	w.log.Error("k8s service caches not synced in time; services follow once they are", "timeout", cfg.syncTimeout())
	go func() {
		if cache.WaitForCacheSync(runCtx.Done(), w.synced...) {
			w.fullSync(runCtx)
			w.run(runCtx)
			return
		}
		close(w.done)
	}()
	return w, nil
}

// Stop stops the informers and waits for the worker.
func (w *ServiceWatcher) Stop() {
	w.once.Do(func() {
		w.cancel()
		<-w.done
	})
}

// The informer callbacks only queue keys.

func (w *ServiceWatcher) serviceChanged(obj any) {
	if k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
		w.queue.Add(k)
	}
}

func (w *ServiceWatcher) sliceChanged(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	if name := s.Labels[discoveryv1.LabelServiceName]; name != "" {
		w.queue.Add(s.Namespace + "/" + name)
	}
	if s.Namespace == apiServerNamespace && s.Name == apiServerSlice {
		w.queue.Add(apiServerNamespace + "/" + apiServerSlice)
	}
}

// nodeChanged requeues every service: the node's addresses are NodePort
// frontends (replacement mode only).
func (w *ServiceWatcher) nodeChanged(any) {
	if !w.view.replacement {
		return
	}
	svcs, err := w.svcs.List(k8slabels.Everything())
	if err != nil {
		return
	}
	for _, s := range svcs {
		w.queue.Add(s.Namespace + "/" + s.Name)
	}
}

// fullSync writes every service as the full set of the k8s source, then
// prunes the datapath's maps.
func (w *ServiceWatcher) fullSync(ctx context.Context) {
	w.view.nodeAddrs = w.nodeAddrs()
	svcs, err := w.svcs.List(k8slabels.Everything())
	if err != nil {
		w.log.Error("list services", "err", err)
		return
	}
	w.syncAPIServer()
	var all []service.Service
	for _, s := range svcs {
		k := s.Namespace + "/" + s.Name
		eps := w.slicesOf(s.Namespace, s.Name)
		out := w.view.translate(s, eps)
		w.sink.SetPolicyService(s.Namespace, s.Name, policyService(s, eps))
		w.held[k] = frontendsOf(out)
		all = append(all, out...)
		if w.hc != nil {
			port, local := healthCheckOf(s, out)
			w.hc.set(k, s.Namespace, s.Name, port, local)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	res, err := w.sink.ReplaceServices(ctx, ServiceSource, all)
	if err != nil {
		w.log.Error("k8s services not written; each is retried as it changes", "err", err)
		for k := range w.held {
			w.queue.Add(k)
		}
	}
	w.sink.PruneServices()
	w.log.Info("k8s services synced", "services", len(svcs), "frontends", len(all), "upserted", res.Upserted, "deleted", res.Deleted)
}

// run is the single worker.
func (w *ServiceWatcher) run(ctx context.Context) {
	defer close(w.done)
	if w.hc != nil {
		defer w.hc.closeAll()
	}
	for {
		k, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		err := w.apply(ctx, k)
		switch {
		case err == nil:
			w.queue.Forget(k)
		case ctx.Err() != nil:
		case w.queue.NumRequeues(k) < maxRetries:
			w.log.Debug("service change not applied; retrying", "service", k, "err", err)
			w.queue.AddRateLimited(k)
		default:
			w.log.Error("service change not applied; giving up until it changes again", "service", k, "err", err)
			w.queue.Forget(k)
		}
		w.queue.Done(k)
	}
}

// apply writes service k's frontends and deletes those it no longer has.
func (w *ServiceWatcher) apply(ctx context.Context, k string) error {
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	ns, name, err := cache.SplitMetaNamespaceKey(k)
	if err != nil {
		return nil
	}
	if ns == apiServerNamespace && name == apiServerSlice {
		w.syncAPIServer()
	}
	w.view.nodeAddrs = w.nodeAddrs()
	var out []service.Service
	svc, err := w.svcs.Services(ns).Get(name)
	switch {
	case err == nil:
		eps := w.slicesOf(ns, name)
		out = w.view.translate(svc, eps)
		w.sink.SetPolicyService(ns, name, policyService(svc, eps))
	case !apierrors.IsNotFound(err):
		return err
	default:
		w.sink.SetPolicyService(ns, name, nil)
		svc = nil
	}
	if w.hc != nil {
		port, local := healthCheckOf(svc, out)
		w.hc.set(k, ns, name, port, local)
	}
	now := frontendsOf(out)
	if len(out) > 0 {
		if _, err := w.sink.UpsertServices(ctx, ServiceSource, out); err != nil {
			return fmt.Errorf("upsert service %s: %w", k, err)
		}
	}
	var gone []service.Frontend
	for _, f := range w.held[k] {
		if !containsFrontend(now, f) {
			gone = append(gone, f)
		}
	}
	if len(gone) > 0 {
		if _, err := w.sink.DeleteService(ctx, ServiceSource, gone...); err != nil {
			return fmt.Errorf("delete frontends of service %s: %w", k, err)
		}
	}
	if len(now) == 0 {
		delete(w.held, k)
	} else {
		w.held[k] = now
	}
	return nil
}

func (w *ServiceWatcher) slicesOf(ns, name string) []*discoveryv1.EndpointSlice {
	sel := k8slabels.SelectorFromSet(k8slabels.Set{discoveryv1.LabelServiceName: name})
	out, err := w.slices.EndpointSlices(ns).List(sel)
	if err != nil {
		return nil
	}
	return out
}

// nodeAddrs are this node's internal and external addresses.
func (w *ServiceWatcher) nodeAddrs() []netip.Addr {
	if !w.view.replacement {
		return nil
	}
	n, err := w.nodes.Get(w.view.node)
	if err != nil {
		return nil
	}
	var ss []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			ss = append(ss, a.Address)
		}
	}
	return parseAddrs(ss)
}

func frontendsOf(svcs []service.Service) []service.Frontend {
	out := make([]service.Frontend, len(svcs))
	for i, s := range svcs {
		out[i] = s.Frontend
	}
	return out
}

func containsFrontend(fs []service.Frontend, f service.Frontend) bool {
	for _, g := range fs {
		if g == f {
			return true
		}
	}
	return false
}

// policyService is what the toServices rules resolve svc to: its labels
// and pod selector, or, without a selector, the addresses of its
// EndpointSlices' endpoints (ready or not, as Cilium takes them).
func policyService(svc *corev1.Service, slices []*discoveryv1.EndpointSlice) *policy.Service {
	out := &policy.Service{Labels: svc.Labels, Selector: svc.Spec.Selector}
	if len(svc.Spec.Selector) > 0 {
		return out
	}
	for _, sl := range slices {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, ep := range sl.Endpoints {
			out.Addrs = append(out.Addrs, parseAddrs(ep.Addresses)...)
		}
	}
	return out
}
