package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Tunables of the endpoint status writer.
const (
	// epCoalesce is how long a change waits before it is written, so a
	// regeneration's several state changes become one write (and the
	// index commit that follows an event is done when the worker reads).
	epCoalesce = 200 * time.Millisecond
	// epResync is the period of the full comparison of the index with the
	// objects; it repairs what an event could not tell (a lost update).
	epResync = 30 * time.Second
	// epWriteQPS and epWriteBurst bound the writes to the API server.
	epWriteQPS, epWriteBurst = 20, 40
)

var endpointsGVR = v2.Resource(v2.EndpointResource)

// endpointWriter keeps one MembraneEndpoint per local pod endpoint in
// step with the index: created when the endpoint appears, updated when its
// identity, addresses, state or realised revision change, deleted when it
// goes. Changes come from the event hub (as triggers; the index is read
// for the truth) and from a periodic full pass; one workqueue worker
// writes, rate limited by its client, never from inside an actor.
type endpointWriter struct {
	node  string
	log   *slog.Logger
	ix    *index.Index
	hub   *events.Hub
	pods  corelisters.PodLister
	dyn   dynamic.Interface
	own   cache.SharedIndexInformer // this node's objects
	queue workqueue.TypedRateLimitingInterface[string]

	// mu guards nodeIP.
	mu     sync.Mutex
	nodeIP string
}

func newEndpointWriter(node string, dyn dynamic.Interface, ix *index.Index, hub *events.Hub, pods corelisters.PodLister, log *slog.Logger) *endpointWriter {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, metav1.NamespaceAll, func(o *metav1.ListOptions) {
		o.LabelSelector = v2.EndpointNodeLabel + "=" + node
	})
	w := &endpointWriter{node: node, log: log.With("worker", "endpoint-status"), ix: ix, hub: hub, pods: pods, dyn: dyn,
		own: f.ForResource(endpointsGVR).Informer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "membrane-endpoint-status"})}
	return w
}

// setNodeIP records this node's address (from its Node object) and
// rewrites every object when it changed.
func (w *endpointWriter) setNodeIP(ip string) {
	w.mu.Lock()
	changed := w.nodeIP != ip
	w.nodeIP = ip
	w.mu.Unlock()
	if changed && w.own.HasSynced() {
		w.enqueueAll()
	}
}

func (w *endpointWriter) getNodeIP() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.nodeIP
}

// run starts the informer, waits for it, reconciles (every object and
// every local endpoint is compared; objects whose endpoint is gone are
// deleted) and then writes changes until ctx ends.
func (w *endpointWriter) run(ctx context.Context) {
	go w.own.Run(ctx.Done())
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	if !cache.WaitForCacheSync(ctx.Done(), w.own.HasSynced) {
		return
	}
	if w.hub != nil {
		sub := w.hub.Subscribe(0)
		defer sub.Close()
		go w.follow(ctx, sub)
	}
	w.enqueueAll()
	go wait.Until(w.enqueueAll, epResync, ctx.Done())
	for w.next(ctx) {
	}
}

// follow turns endpoint events into delayed queue keys.
func (w *endpointWriter) follow(ctx context.Context, sub *events.Subscription) {
	for {
		ev, err := sub.Next(ctx)
		if err != nil {
			return
		}
		switch {
		case ev.Type == events.Missed:
			w.enqueueAll()
		case ev.Pod == "" || ev.Namespace == "":
		case ev.Type == events.EndpointCreated, ev.Type == events.EndpointStateChanged, ev.Type == events.EndpointDeleted:
			w.queue.AddAfter(ev.Namespace+"/"+ev.Pod, epCoalesce)
		}
	}
}

// enqueueAll queues every local pod endpoint and every object of this node.
func (w *endpointWriter) enqueueAll() {
	for _, ep := range w.ix.Endpoints(index.EndpointFilter{}) {
		if k := ep.PodKey(); ep.Namespace != "" && ep.PodName != "" {
			w.queue.Add(k)
		}
	}
	for _, k := range w.own.GetStore().ListKeys() {
		w.queue.Add(k)
	}
}

func (w *endpointWriter) next(ctx context.Context) bool {
	k, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(k)
	wctx, cancel := context.WithTimeout(ctx, applyTimeout)
	err := w.sync(wctx, k)
	cancel()
	switch {
	case err == nil:
		w.queue.Forget(k)
	case ctx.Err() != nil:
	case w.queue.NumRequeues(k) < maxRetries:
		w.log.Debug("endpoint status not written; retrying", "pod", k, "err", err)
		w.queue.AddRateLimited(k)
	default:
		w.log.Error("endpoint status not written; giving up until the endpoint changes again", "pod", k, "err", err)
		w.queue.Forget(k)
	}
	return true
}

// errNoPod is an endpoint whose pod is not cached: the object needs the
// pod's UID for its owner reference.
var errNoPod = errors.New("pod not cached")

// sync makes the object of pod key match the pod's endpoint.
func (w *endpointWriter) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil //nolint:nilerr // not a key this writer queues
	}
	obj, exists, err := w.own.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	ep := primaryEndpoint(w.ix.Endpoints(index.EndpointFilter{Namespace: ns, PodName: name}))
	client := w.dyn.Resource(endpointsGVR).Namespace(ns)
	if ep == nil {
		if !exists {
			return nil
		}
		err := client.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete membraneendpoint %s: %w", key, err)
		}
		w.log.Info("endpoint status deleted", "pod", key)
		return nil
	}
	pod, err := w.pods.Pods(ns).Get(name)
	if err != nil {
		if exists {
			return nil // the pod is gone: its object goes with it (owner) or with the endpoint
		}
		return fmt.Errorf("membraneendpoint %s: %w", key, errNoPod)
	}
	want, err := w.desired(ep, pod)
	if err != nil {
		return err
	}
	if exists {
		cur, _ := obj.(*unstructured.Unstructured)
		if cur != nil && sameEndpointObject(cur, want) {
			return nil
		}
		if cur != nil {
			want.SetResourceVersion(cur.GetResourceVersion())
		}
		if _, err := client.Update(ctx, want, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update membraneendpoint %s: %w", key, err)
		}
		return nil
	}
	_, err = client.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Not cached yet (or left by a pod of the same name): take it over.
		cur, gerr := client.Get(ctx, name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("get membraneendpoint %s: %w", key, gerr)
		}
		want.SetResourceVersion(cur.GetResourceVersion())
		_, err = client.Update(ctx, want, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("create membraneendpoint %s: %w", key, err)
	}
	w.log.Info("endpoint status created", "pod", key, "endpoint", ep.ID)
	return nil
}

// primaryEndpoint is the live endpoint of a pod with the lowest ID (a pod
// with several interfaces has one object, as in Cilium).
func primaryEndpoint(eps []*endpoint.Endpoint) *endpoint.Endpoint {
	var best *endpoint.Endpoint
	for _, ep := range eps {
		if ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
			continue
		}
		if best == nil || ep.ID < best.ID {
			best = ep
		}
	}
	return best
}

// desired is the object for ep of pod.
func (w *endpointWriter) desired(ep *endpoint.Endpoint, pod *corev1.Pod) (*unstructured.Unstructured, error) {
	st := v2.EndpointStatus{ID: int64(ep.ID), State: string(ep.State), PolicyRevision: int64(ep.RealizedRevision),
		Networking: v2.EndpointNetworking{IPv4: addrString(ep.IPv4), IPv6: addrString(ep.IPv6), NodeName: w.node, NodeIP: w.getNodeIP()}}
	if ep.Identity != 0 {
		st.Identity = &v2.EndpointIdentity{ID: int64(ep.Identity), Labels: ep.Labels.Strings()}
	}
	for _, p := range ep.NamedPorts {
		st.NamedPorts = append(st.NamedPorts, v2.EndpointNamedPort{Name: p.Name, Port: int32(p.Port), Protocol: policy.ProtoName(p.Proto)})
	}
	t := true
	mep := &v2.MembraneEndpoint{
		TypeMeta: metav1.TypeMeta{APIVersion: v2.GroupVersion.String(), Kind: v2.EndpointKind},
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace,
			Labels: map[string]string{v2.EndpointNodeLabel: w.node},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				BlockOwnerDeletion: &t}}},
		Status: st,
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(mep)
	if err != nil {
		return nil, fmt.Errorf("membraneendpoint %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// sameEndpointObject reports whether cur already says what want says
// (status, node label, owner).
func sameEndpointObject(cur, want *unstructured.Unstructured) bool {
	if cur.GetLabels()[v2.EndpointNodeLabel] != want.GetLabels()[v2.EndpointNodeLabel] {
		return false
	}
	co, wo := cur.GetOwnerReferences(), want.GetOwnerReferences()
	if len(co) != 1 || co[0].UID != wo[0].UID {
		return false
	}
	var a, b v2.EndpointStatus
	if err := fromUnstructuredField(cur, &a); err != nil {
		return false
	}
	if err := fromUnstructuredField(want, &b); err != nil {
		return false
	}
	return sameStatus(a, b)
}

func sameStatus(a, b v2.EndpointStatus) bool {
	if (a.Identity == nil) != (b.Identity == nil) {
		return false
	}
	if a.Identity != nil && (a.Identity.ID != b.Identity.ID || !slices.Equal(a.Identity.Labels, b.Identity.Labels)) {
		return false
	}
	return a.ID == b.ID && a.State == b.State && a.PolicyRevision == b.PolicyRevision && a.Networking == b.Networking &&
		slices.Equal(a.NamedPorts, b.NamedPorts)
}

func fromUnstructuredField(u *unstructured.Unstructured, st *v2.EndpointStatus) error {
	m, ok := u.Object["status"].(map[string]any)
	if !ok {
		return errors.New("no status")
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, st)
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
