package k8s

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	netlisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// kind is what a queued key names.
type kind uint8

const (
	kindPod kind = iota
	kindNamespace
	kindPolicy
	kindMNP  // MembraneNetworkPolicy
	kindMCNP // MembraneClusterwideNetworkPolicy
	kindCNP  // CiliumNetworkPolicy (cilium.io/v2)
	kindCCNP // CiliumClusterwideNetworkPolicy (cilium.io/v2)
)

// key is one queued change: the object is read from the cache when the
// worker gets to it, so repeated changes collapse into one.
type key struct {
	kind      kind
	namespace string // "" for a namespace
	name      string
}

func (k key) String() string { return k.namespace + "/" + k.name }

// maxRetries bounds the retries of a change the actors refused (a timeout,
// an endpoint busy deleting); the next change of the object retries too.
const maxRetries = 15

// Watcher watches the API server and applies what it sees.
type Watcher struct {
	cfg Config
	log *slog.Logger
	// filter chooses the identity-relevant labels of pods (Config.Labels).
	filter *labels.Filter
	sys    *actors.System
	ix     *index.Index
	server string

	pods   corelisters.PodLister
	nss    corelisters.NamespaceLister
	nps    netlisters.NetworkPolicyLister
	dyn    dynamic.Interface
	events record.EventRecorder
	// crdListers are the policy custom resources' caches by queue kind.
	crdListers map[kind]cache.GenericLister
	synced     map[string]cache.InformerSynced
	queue      workqueue.TypedRateLimitingInterface[key]
	cancel     context.CancelFunc
	done       chan struct{}
	stopOnce   sync.Once
	workers    sync.WaitGroup // the endpoint, remote and node workers

	eps    *endpointWriter
	remote *remoteEndpoints
	nodes  *nodeWatch
	// health publishes the health endpoint's addresses on this Node.
	health *healthPublisher
	// nodesSynced reports the Node cache listed (remote claims wait for it).
	nodesSynced cache.InformerSynced

	// mu guards the fields below.
	mu sync.Mutex
	// podWaiters are closed when their pod ("ns/name") enters the cache.
	podWaiters map[string][]chan struct{}
	// initBase holds, per pod ("ns/name"), the labels the CNI ADD sent for
	// an endpoint created with the init identity, until it is relabelled
	// (or the pod is deleted).
	initBase     map[string]labels.Labels
	state        string
	policyErrors int
	// policiesPartial counts policies imported with refused parts.
	policiesPartial int
	conn            conn
	// statusWritten is the verdict last written to each policy custom
	// resource's status.nodes[node] (by policy key).
	statusWritten map[string]string
}

// Start connects to the API server, starts the informers and waits
// (bounded by cfg.SyncTimeout) for their caches, then applies what they
// hold: pods' labels to their endpoints, NetworkPolicies to the policy
// repository (policies imported by an earlier run and gone since are
// deleted). On a sync timeout it logs, reports "sync-timeout" and carries
// on syncing in the background.
func Start(ctx context.Context, cfg Config, sys *actors.System, log *slog.Logger) (*Watcher, error) {
	if cfg.SyncTimeout == 0 {
		cfg.SyncTimeout = 2 * time.Minute
	}
	if cfg.PodWait == 0 {
		cfg.PodWait = 10 * time.Second
	}
	rc, client, err := cfg.clientset("start k8s watcher")
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("start k8s watcher: %w", err)
	}
	log = log.With("component", "k8s", "node", cfg.NodeName)
	filter, err := labels.NewFilter(cfg.Labels)
	if err != nil {
		return nil, fmt.Errorf("start k8s watcher: %w", err)
	}
	w := &Watcher{cfg: cfg, log: log, filter: filter, sys: sys, ix: sys.Index, server: rc.Host, done: make(chan struct{}), dyn: dyn,
		podWaiters: map[string][]chan struct{}{}, initBase: map[string]labels.Labels{}, state: "syncing",
		conn: conn{state: connConnecting}, statusWritten: map[string]string{}, crdListers: map[kind]cache.GenericLister{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[key](),
			workqueue.TypedRateLimitingQueueConfig[key]{Name: "membrane-k8s"})}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	w.events = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "membrane-agent", Host: cfg.NodeName})
	all := informers.NewSharedInformerFactory(client, 0)
	local := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	crds := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	podInf, nsInf, npInf := local.Core().V1().Pods(), all.Core().V1().Namespaces(), all.Networking().V1().NetworkPolicies()
	w.pods, w.nss, w.nps = podInf.Lister(), nsInf.Lister(), npInf.Lister()
	nodeInf, err := w.startClusterWatches(rc, all, sys)
	if err != nil {
		return nil, fmt.Errorf("start k8s watcher: %w", err)
	}
	handlers := []struct {
		name string
		inf  cache.SharedIndexInformer
		fn   cache.ResourceEventHandler
	}{
		{"pods", podInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: w.podAdded, UpdateFunc: w.podUpdated, DeleteFunc: w.podDeleted}},
		{"namespaces", nsInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: w.nsChanged(nil), UpdateFunc: func(o, n any) { w.nsChanged(o)(n) }}},
		{"networkpolicies", npInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: w.npChanged, UpdateFunc: w.npUpdated, DeleteFunc: w.npChanged}},
	}
	policyKinds, err := policyKindsOf(cfg.PolicyAPIGroups)
	if err != nil {
		return nil, fmt.Errorf("start k8s watcher: %w", err)
	}
	if err := checkServed(client, policyKinds); err != nil {
		return nil, fmt.Errorf("start k8s watcher: %w", err)
	}
	for _, k := range policyKinds {
		inf := crds.ForResource(crdKinds[k].gvr)
		w.crdListers[k] = inf.Lister()
		handlers = append(handlers, struct {
			name string
			inf  cache.SharedIndexInformer
			fn   cache.ResourceEventHandler
		}{crdKinds[k].gvr.Resource, inf.Informer(), w.crdChanged(k)})
	}
	secrets := newSecretWatch(w, client, w.sys.Config.PolicySecretsNamespace, cfg.Secrets)
	if secrets != nil {
		handlers = append(handlers, struct {
			name string
			inf  cache.SharedIndexInformer
			fn   cache.ResourceEventHandler
		}{"secrets", secrets.informer(), secrets.handler()})
	}
	w.synced = map[string]cache.InformerSynced{}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.fn); err != nil {
			return nil, fmt.Errorf("start k8s watcher: %w", err)
		}
		if err := h.inf.SetWatchErrorHandlerWithContext(w.watchError(h.name)); err != nil {
			return nil, fmt.Errorf("start k8s watcher: %w", err)
		}
		w.synced[h.name] = h.inf.HasSynced
	}
	if err := nodeInf.SetWatchErrorHandlerWithContext(w.watchError("nodes")); err != nil {
		return nil, fmt.Errorf("start k8s watcher: %w", err)
	}
	w.synced["nodes"], w.synced["membraneendpoints"] = nodeInf.HasSynced, w.eps.own.HasSynced
	runCtx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	all.Start(runCtx.Done())
	local.Start(runCtx.Done())
	crds.Start(runCtx.Done())
	if secrets != nil {
		secrets.factory.Start(runCtx.Done())
	}
	go w.probe(runCtx, client, cmp.Or(cfg.ProbeInterval, 5*time.Second))
	w.runWorkers(runCtx, rc)
	go func() {
		<-runCtx.Done()
		w.queue.ShutDown()
		all.Shutdown()
		local.Shutdown()
		crds.Shutdown()
		if secrets != nil {
			secrets.factory.Shutdown()
		}
		broadcaster.Shutdown()
	}()
	log.Info("waiting for the k8s caches", "server", rc.Host, "timeout", cfg.SyncTimeout)
	syncCtx, stop := context.WithTimeout(ctx, cfg.SyncTimeout)
	defer stop()
	if !cache.WaitForCacheSync(syncCtx.Done(), w.syncedFuncs()...) {
		w.setState("sync-timeout")
		log.Error("k8s caches not synced in time; serving anyway, pods not cached yet get the init identity",
			"timeout", cfg.SyncTimeout, "not-synced", w.notSynced())
		go w.finishSync(runCtx)
	} else {
		w.markSynced()
	}
	workers := cmp.Or(cfg.Workers, defaultWorkers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(runCtx)
		}()
	}
	go func() {
		wg.Wait()
		close(w.done)
	}()
	return w, nil
}

// finishSync waits for the caches after a sync timeout.
func (w *Watcher) finishSync(ctx context.Context) {
	if cache.WaitForCacheSync(ctx.Done(), w.syncedFuncs()...) {
		w.markSynced()
	}
}

// syncedFuncs are the caches the start waits for: every one but the
// local endpoint status objects', which the endpoint writer syncs on its
// own.
func (w *Watcher) syncedFuncs() []cache.InformerSynced {
	out := make([]cache.InformerSynced, 0, len(w.synced))
	for _, name := range slices.Sorted(maps.Keys(w.synced)) {
		if name != "membraneendpoints" {
			out = append(out, w.synced[name])
		}
	}
	return out
}

// notSynced names the caches not synced yet.
func (w *Watcher) notSynced() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(w.synced)) {
		if !w.synced[name]() {
			out = append(out, name)
		}
	}
	return out
}

// markSynced runs once the caches synced: it prunes the policies an earlier
// run imported that the API server no longer has.
func (w *Watcher) markSynced() {
	for _, row := range w.ix.Policies() {
		p := row.Policy
		if !fromKubernetes(p) {
			continue
		}
		if p.Kind != policy.KindKNP {
			w.pruneCRDPolicy(p)
			continue
		}
		if _, err := w.nps.NetworkPolicies(p.Namespace).Get(p.Name); apierrors.IsNotFound(err) {
			w.queue.Add(key{kind: kindPolicy, namespace: p.Namespace, name: p.Name})
		}
	}
	w.setState("synced")
	w.log.Info("k8s caches synced")
}

func (w *Watcher) setState(s string) {
	w.mu.Lock()
	w.state = s
	w.mu.Unlock()
}

// Stop stops the informers and the worker and waits for the worker.
func (w *Watcher) Stop() {
	w.stopOnce.Do(func() {
		w.cancel()
		<-w.done
		w.workers.Wait()
	})
}

// Status is the k8s part of GET /v1/status.
func (w *Watcher) Status() *models.K8sStatus {
	st := &models.K8sStatus{Node: w.cfg.NodeName, Server: w.server, Synced: map[string]bool{}, Queue: w.queue.Len()}
	for name, fn := range w.synced {
		st.Synced[name] = fn()
	}
	if ps, err := w.pods.List(k8slabels.Everything()); err == nil {
		st.Pods = len(ps)
	}
	if ns, err := w.nss.List(k8slabels.Everything()); err == nil {
		st.Namespaces = len(ns)
	}
	if nps, err := w.nps.List(k8slabels.Everything()); err == nil {
		st.Policies = len(nps)
	}
	for _, l := range w.crdListers {
		if objs, err := l.List(k8slabels.Everything()); err == nil {
			st.MembranePolicies += len(objs)
		}
	}
	w.mu.Lock()
	st.State, st.PolicyErrors, st.PoliciesPartial = w.state, w.policyErrors, w.policiesPartial
	st.Connection, st.LastError, st.Disconnects = w.conn.state, w.conn.lastError, w.conn.disconnects
	if !w.conn.lastErrorAt.IsZero() {
		t := w.conn.lastErrorAt.UTC()
		st.LastErrorAt = &t
	}
	if !w.conn.lastContact.IsZero() {
		t := w.conn.lastContact.UTC()
		st.LastContact = &t
	}
	w.mu.Unlock()
	w.clusterStatus(st)
	return st
}

// The informer callbacks below only queue keys and wake waiters: they
// never block.

func (w *Watcher) podAdded(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	name := pod.Namespace + "/" + pod.Name
	w.mu.Lock()
	for _, ch := range w.podWaiters[name] {
		close(ch)
	}
	delete(w.podWaiters, name)
	w.mu.Unlock()
	w.queue.Add(key{kind: kindPod, namespace: pod.Namespace, name: pod.Name})
}

func (w *Watcher) podUpdated(oldObj, newObj any) {
	o, ok1 := oldObj.(*corev1.Pod)
	n, ok2 := newObj.(*corev1.Pod)
	if ok1 && ok2 && equality.Semantic.DeepEqual(o.Labels, n.Labels) && o.Spec.ServiceAccountName == n.Spec.ServiceAccountName &&
		PodPolicyAudit(o) == PodPolicyAudit(n) {
		return // nothing an endpoint's labels or audit mode derive from changed
	}
	w.podAdded(newObj)
}

func (w *Watcher) podDeleted(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		w.mu.Lock()
		delete(w.initBase, pod.Namespace+"/"+pod.Name)
		w.mu.Unlock()
	}
}

func (w *Watcher) nsChanged(oldObj any) func(any) {
	return func(obj any) {
		n, ok := obj.(*corev1.Namespace)
		if !ok {
			return
		}
		if o, ok := oldObj.(*corev1.Namespace); ok && equality.Semantic.DeepEqual(o.Labels, n.Labels) {
			return
		}
		w.queue.Add(key{kind: kindNamespace, name: n.Name})
	}
}

// npUpdated queues a NetworkPolicy update unless it is the same object
// version (a relist after an API outage): re-importing an unchanged policy
// would regenerate every endpoint it selects.
func (w *Watcher) npUpdated(oldObj, newObj any) {
	o, ok1 := oldObj.(*networkingv1.NetworkPolicy)
	n, ok2 := newObj.(*networkingv1.NetworkPolicy)
	if ok1 && ok2 && o.ResourceVersion == n.ResourceVersion {
		return
	}
	w.npChanged(newObj)
}

func (w *Watcher) npChanged(obj any) {
	k, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	ns, name, err := cache.SplitMetaNamespaceKey(k)
	if err != nil {
		return
	}
	w.queue.Add(key{kind: kindPolicy, namespace: ns, name: name})
}

// defaultWorkers is how many workers apply queued changes: a relabel
// waits for its endpoint's regeneration (a BPF program load), so one
// worker would serialise a burst of pod changes. The workqueue never
// hands one key to two workers at once.
const defaultWorkers = 4

// run is one worker: it applies queued changes one by one.
func (w *Watcher) run(ctx context.Context) {
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
			w.log.Debug("k8s change not applied; retrying", "object", k.String(), "err", err)
			w.queue.AddRateLimited(k)
		default:
			w.log.Error("k8s change not applied; giving up until the object changes again", "object", k.String(), "err", err)
			w.queue.Forget(k)
		}
		w.queue.Done(k)
	}
}

// applyTimeout bounds one change's wait for the actors.
const applyTimeout = 30 * time.Second

func (w *Watcher) apply(ctx context.Context, k key) error {
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	switch k.kind {
	case kindPod:
		return w.syncPod(ctx, k.namespace, k.name)
	case kindNamespace:
		pods, err := w.pods.Pods(k.name).List(k8slabels.Everything())
		if err != nil {
			return err
		}
		for _, p := range pods {
			w.queue.Add(key{kind: kindPod, namespace: p.Namespace, name: p.Name})
		}
		return nil
	case kindMNP, kindMCNP, kindCNP, kindCCNP:
		return w.syncCRDPolicy(ctx, k.kind, k.namespace, k.name)
	default:
		return w.syncPolicy(ctx, k.namespace, k.name)
	}
}

// errNoEndpointYet is a pod whose init endpoint is not in the index yet
// (its CNI ADD is still creating it): retried.
var errNoEndpointYet = errors.New("endpoint of an init pod not created yet")

// syncPod relabels the endpoints of a pod to its current labels.
func (w *Watcher) syncPod(ctx context.Context, ns, name string) error {
	pod, err := w.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil // deleting the endpoint is the CNI DEL's
	}
	if err != nil {
		return err
	}
	eps := w.ix.Endpoints(index.EndpointFilter{Namespace: ns, PodName: name})
	w.mu.Lock()
	base, pending := w.initBase[ns+"/"+name]
	w.mu.Unlock()
	if len(eps) == 0 {
		if pending {
			return errNoEndpointYet
		}
		return nil
	}
	podLabels := w.podLabels(pod, w.namespace(ns))
	ports := PodNamedPorts(pod, w.log)
	audit := PodPolicyAudit(pod)
	for _, ep := range eps {
		cur := ep.Labels
		b := cur
		if cur.Equal(initLabels) {
			b = base // the labels the ADD sent (none if the agent restarted since)
		}
		add, del := diffLabels(cur, desiredLabels(b, podLabels))
		if len(add) == 0 && len(del) == 0 && ep.NamedPorts.Equal(ports) && ep.PolicyAudit == audit {
			continue
		}
		if _, err := w.sys.PatchPodLabels(ctx, ep.ID, add, del, ports, audit); err != nil {
			if errors.Is(err, actors.ErrEndpointNotFound) {
				continue
			}
			return fmt.Errorf("relabel endpoint %d of pod %s/%s: %w", ep.ID, ns, name, err)
		}
		w.log.Info("endpoint labels patched", "endpoint", ep.ID, "pod", ns+"/"+name, "added", labels.Labels(add).String(), "deleted", labels.Labels(del).String())
	}
	w.mu.Lock()
	delete(w.initBase, ns+"/"+name)
	w.mu.Unlock()
	return nil
}

func (w *Watcher) namespace(name string) *corev1.Namespace {
	ns, err := w.nss.Get(name)
	if err != nil {
		return nil
	}
	return ns
}

// syncPolicy imports the NetworkPolicy ns/name, or deletes it when the
// API server no longer has it. A policy with parts the agent refuses is
// imported without them (they allow nothing; its pods stay isolated). A
// policy whose subject or policy types the agent cannot understand is
// refused whole; its previous version (if any) stays in force. Either is
// counted, logged, published and recorded as a Warning event on the
// NetworkPolicy (recordRefusal).
func (w *Watcher) syncPolicy(ctx context.Context, ns, name string) error {
	np, err := w.nps.NetworkPolicies(ns).Get(name)
	if apierrors.IsNotFound(err) {
		_, err := w.sys.DeletePolicy(ctx, ns+"/"+name, nil)
		if err != nil && !errors.Is(err, policy.ErrNotFound) {
			return fmt.Errorf("delete networkpolicy %s/%s: %w", ns, name, err)
		}
		if err == nil {
			w.log.Info("networkpolicy deleted", "policy", ns+"/"+name)
		}
		return nil
	}
	if err != nil {
		return err
	}
	p, err := convertPolicy(np, w.parseOptions())
	if err != nil {
		w.recordRefusal(np, policy.KindKNP, ns, ns+"/"+name, nil, err)
		return nil // retrying cannot help; the next update of it will
	}
	res, err := w.sys.ImportPolicy(ctx, []*policy.Policy{p})
	if errors.Is(err, policy.ErrInvalidPolicy) {
		w.recordRefusal(np, policy.KindKNP, ns, ns+"/"+name, nil, err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("import networkpolicy %s/%s: %w", ns, name, err)
	}
	if p.Partial() {
		w.recordRefusal(np, policy.KindKNP, ns, ns+"/"+name, p, nil)
	}
	w.log.Info("networkpolicy imported", "policy", ns+"/"+name, "revision", res.Revision)
	return nil
}

// Labels is the API's endpoint labeler: it returns spec's labels with its
// pod's and the pod's named ports, and sets spec.PolicyAudit from the
// pod's AuditAnnotation (a pod created in audit mode starts in it),
// waiting up to Config.PodWait for the pod to be cached. A pod not
// cached in time gets the init identity's labels (and spec's ports) and
// is relabelled when it appears.
func (w *Watcher) Labels(ctx context.Context, spec *endpoint.Endpoint) (labels.Labels, policy.NamedPorts, error) {
	pod, err := w.waitPod(ctx, spec.Namespace, spec.PodName)
	if err != nil {
		return nil, nil, err
	}
	if pod == nil {
		w.mu.Lock()
		w.initBase[spec.Namespace+"/"+spec.PodName] = spec.Labels
		w.mu.Unlock()
		w.log.Warn("pod not in the cache; endpoint gets the init identity until it is", "pod", spec.Namespace+"/"+spec.PodName, "waited", w.cfg.PodWait)
		// The pod may have arrived between the wait and the line above:
		// its worker pass then retries until the endpoint exists.
		w.queue.Add(key{kind: kindPod, namespace: spec.Namespace, name: spec.PodName})
		return initLabels, spec.NamedPorts, nil
	}
	spec.PolicyAudit = PodPolicyAudit(pod)
	return desiredLabels(spec.Labels, w.podLabels(pod, w.namespace(spec.Namespace))), PodNamedPorts(pod, w.log), nil
}

// waitPod returns the cached pod, waiting up to PodWait for it (nil: not
// cached in time).
func (w *Watcher) waitPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	if pod, err := w.pods.Pods(ns).Get(name); err == nil {
		return pod, nil
	}
	ch := make(chan struct{})
	full := ns + "/" + name
	w.mu.Lock()
	w.podWaiters[full] = append(w.podWaiters[full], ch)
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		ws := w.podWaiters[full]
		for i, c := range ws {
			if c == ch {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(w.podWaiters, full)
		} else {
			w.podWaiters[full] = ws
		}
		w.mu.Unlock()
	}()
	// Checked again: the pod may have been added before the waiter was.
	if pod, err := w.pods.Pods(ns).Get(name); err == nil {
		return pod, nil
	}
	t := time.NewTimer(w.cfg.PodWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for pod %s: %w", full, ctx.Err())
	}
	pod, err := w.pods.Pods(ns).Get(name)
	if err != nil {
		return nil, nil //nolint:nilerr // not cached: the init identity
	}
	return pod, nil
}
