package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/membrane-cni/membrane/actors"
	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// crdKinds maps the queue kinds of the policy custom resources to their
// resources and policy kinds.
var crdKinds = map[kind]struct {
	gvr        schema.GroupVersionResource
	policyKind string
	apiVersion string // of the policy document the object becomes
	namespaced bool
}{
	kindMNP:  {v2.Resource(v2.ResourceNetworkPolicies), policy.KindMNP, policy.APIVersionMembrane, true},
	kindMCNP: {v2.Resource(v2.ResourceClusterwideNetworkPolicies), policy.KindMCNP, policy.APIVersionMembrane, false},
	kindCNP:  {ciliumResource("ciliumnetworkpolicies"), policy.KindCNP, policy.APIVersionCNP, true},
	kindCCNP: {ciliumResource("ciliumclusterwidenetworkpolicies"), policy.KindCCNP, policy.APIVersionCNP, false},
}

// The API groups of --policy-api-groups.
const (
	GroupMembrane = "membrane.io"
	GroupCilium   = "cilium.io"
)

func ciliumResource(plural string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: GroupCilium, Version: "v2", Resource: plural}
}

// policyKindsOf returns the policy custom resource kinds of the API
// groups (default: membrane.io).
func policyKindsOf(groups []string) ([]kind, error) {
	if len(groups) == 0 {
		groups = []string{GroupMembrane}
	}
	var out []kind
	for _, g := range groups {
		var ks []kind
		switch g {
		case GroupMembrane:
			ks = []kind{kindMNP, kindMCNP}
		case GroupCilium:
			ks = []kind{kindCNP, kindCCNP}
		default:
			return nil, fmt.Errorf("policy API group %q: want %s or %s", g, GroupMembrane, GroupCilium)
		}
		for _, k := range ks {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	return out, nil
}

// checkServed fails when the API server does not serve the resource of
// one of kinds of the cilium.io group: a watch of it would never sync
// (the operator chose the group and Cilium's CRDs are not installed).
// Membrane's own CRDs come with its manifests; an agent started before
// them keeps waiting for them as before.
func checkServed(client kubernetes.Interface, kinds []kind) error {
	for _, k := range kinds {
		gvr := crdKinds[k].gvr
		if gvr.Group != GroupCilium {
			continue
		}
		list, err := client.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("discover %s: %w", gvr.GroupVersion(), err)
		}
		if list == nil || !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == gvr.Resource }) {
			return fmt.Errorf("the API server does not serve %s (install its CustomResourceDefinition, or leave %s out of --policy-api-groups)",
				gvr.GroupResource(), gvr.Group)
		}
	}
	return nil
}

// crdChanged queues a policy custom resource. An update that changed
// neither the generation (the spec) nor the labels (a status write, a
// relist after an API outage) is not queued: re-importing an unchanged
// policy would regenerate every endpoint it selects.
func (w *Watcher) crdChanged(k kind) cache.ResourceEventHandlerFuncs {
	add := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			return
		}
		w.queue.Add(key2(k, ns, name))
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: add,
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*unstructured.Unstructured)
			n, ok2 := newObj.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetGeneration() == n.GetGeneration() && maps.Equal(o.GetLabels(), n.GetLabels()) {
				return
			}
			add(newObj)
		},
		DeleteFunc: add,
	}
}

func key2(k kind, ns, name string) key { return key{kind: k, namespace: ns, name: name} }

// crdPolicyKey is the policy repository's key of a custom resource.
func crdPolicyKey(k kind, ns, name string) string {
	if !crdKinds[k].namespaced {
		ns = ""
	}
	if k == kindCNP || k == kindCCNP {
		return policy.KeyOfObject(crdKinds[k].policyKind, ns, name)
	}
	return policy.KeyOf(crdKinds[k].policyKind, ns, name)
}

// getCRD reads a policy custom resource from its informer's cache.
func (w *Watcher) getCRD(k kind, ns, name string) (*unstructured.Unstructured, error) {
	lister := w.crdListers[k]
	if lister == nil {
		// Its API group is not read (any more): a policy an earlier run
		// imported from it goes.
		return nil, apierrors.NewNotFound(crdKinds[k].gvr.GroupResource(), name)
	}
	var (
		obj runtime.Object
		err error
	)
	if crdKinds[k].namespaced {
		obj, err = lister.ByNamespace(ns).Get(name)
	} else {
		obj, err = lister.Get(name)
	}
	if err != nil {
		return nil, err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("%s %s: unexpected cache object %T", crdKinds[k].policyKind, name, obj)
	}
	return u, nil
}

// syncCRDPolicy imports a MembraneNetworkPolicy or
// MembraneClusterwideNetworkPolicy, or deletes it when the API server no
// longer has it. A policy with parts the agent refuses is imported
// without them (they allow nothing; its pods stay isolated); a policy
// whose subject or directions the agent cannot understand is refused
// whole and its previous generation (if any) stays in force. Either is
// counted, logged, published, reported on the object's
// status.nodes[node] (Refused, ConditionAccepted) and recorded as a
// Warning event.
func (w *Watcher) syncCRDPolicy(ctx context.Context, k kind, ns, name string) error {
	pkey := crdPolicyKey(k, ns, name)
	u, err := w.getCRD(k, ns, name)
	if apierrors.IsNotFound(err) {
		w.forgetStatus(pkey)
		_, err := w.sys.DeletePolicy(ctx, pkey, nil)
		if err != nil && !errors.Is(err, policy.ErrNotFound) {
			return fmt.Errorf("delete %s %s: %w", crdKinds[k].policyKind, pkey, err)
		}
		if err == nil {
			w.log.Info("policy deleted", "kind", crdKinds[k].policyKind, "policy", pkey)
		}
		return nil
	}
	if err != nil {
		return err
	}
	p, err := convertCRDPolicy(crdKinds[k].apiVersion, crdKinds[k].policyKind, u, w.parseOptions())
	var res actors.PolicyResult
	if err == nil {
		// The repository refuses what this agent cannot enforce as an
		// invalid policy: refused like a conversion error, not retried.
		res, err = w.sys.ImportPolicy(ctx, []*policy.Policy{p})
		if err != nil && !errors.Is(err, policy.ErrInvalidPolicy) {
			return fmt.Errorf("import %s %s: %w", crdKinds[k].policyKind, pkey, err)
		}
	}
	if err != nil {
		w.recordRefusal(u, crdKinds[k].policyKind, u.GetNamespace(), pkey, nil, err)
		inForce := slices.ContainsFunc(w.ix.Policies(), func(r *index.PolicyRow) bool { return r.Key == pkey })
		w.reportPolicy(ctx, k, u, v2.PolicyNodeStatus{Error: err.Error(), Enforcing: inForce})
		return nil // retrying cannot help; the next update of it will
	}
	w.log.Info("policy imported", "kind", crdKinds[k].policyKind, "policy", pkey, "revision", res.Revision, "refused-parts", len(p.Refused))
	st := v2.PolicyNodeStatus{OK: true, Enforcing: true, LocalPolicyRevision: res.Revision}
	if p.Partial() {
		w.recordRefusal(u, crdKinds[k].policyKind, u.GetNamespace(), pkey, p, nil)
		st.OK, st.Error = false, "partially refused: "+p.RefusedSummary()
		for _, r := range p.Refused {
			st.Refused = append(st.Refused, r.String())
		}
	}
	w.reportPolicy(ctx, k, u, st)
	return nil
}

// convertCRDPolicy turns a policy custom resource into the policy
// repository's input by way of the policy parser, as convertPolicy does
// for NetworkPolicies: the document keeps name, namespace, labels and
// spec/specs, and gets SourceAnnotation. Returns an error wrapping
// policy.ErrInvalidPolicy naming the field the agent does not support.
func convertCRDPolicy(apiVersion, policyKind string, u *unstructured.Unstructured, opts policy.ParseOptions) (*policy.Policy, error) {
	md := map[string]any{"name": u.GetName(), "annotations": map[string]string{SourceAnnotation: "kubernetes"}}
	if len(u.GetLabels()) > 0 {
		md["labels"] = u.GetLabels()
	}
	if ns := u.GetNamespace(); ns != "" {
		md["namespace"] = ns
	}
	doc := map[string]any{"apiVersion": apiVersion, "kind": policyKind, "metadata": md}
	for _, f := range []string{"spec", "specs"} {
		if v, ok := u.Object[f]; ok {
			doc[f] = v
		}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("convert %s %s: %w", policyKind, u.GetName(), err)
	}
	pols, err := policy.ParseWith(b, opts)
	if err != nil {
		return nil, fmt.Errorf("convert %s: %w", policyKind, err)
	}
	return pols[0], nil
}

// statusTimeout bounds one status write; a failed write is logged and
// retried with the policy's next change (the verdict stays in the agent's
// log, events and GET /v1/status meanwhile).
const statusTimeout = 10 * time.Second

// reportPolicy writes this node's entry of the object's status (a merge
// patch of status.nodes[node], so agents on other nodes never conflict)
// when the verdict changed. Refusals are recorded as events by
// recordRefusal.
func (w *Watcher) reportPolicy(ctx context.Context, k kind, u *unstructured.Unstructured, st v2.PolicyNodeStatus) {
	pkey := crdPolicyKey(k, u.GetNamespace(), u.GetName())
	st.Generation = u.GetGeneration()
	st.LastUpdated = metav1.Now()
	cond := metav1.Condition{Type: v2.ConditionAccepted, Status: metav1.ConditionTrue, Reason: "Accepted",
		Message: "in force whole", ObservedGeneration: st.Generation, LastTransitionTime: st.LastUpdated}
	switch {
	case len(st.Refused) > 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonPolicyPartiallyRefused, st.Error
	case !st.OK:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonPolicyRefused, st.Error
	}
	st.Conditions = []metav1.Condition{cond}
	verdict := fmt.Sprintf("%t|%s|%d", st.OK, st.Error, st.Generation)
	w.mu.Lock()
	same := w.statusWritten[pkey] == verdict
	w.mu.Unlock()
	if same {
		return
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"nodes": map[string]any{w.cfg.NodeName: st}}})
	if err != nil {
		w.log.Error("policy status not written", "policy", pkey, "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	if _, err := namespacedResource(w.dyn, k, u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, body,
		metav1.PatchOptions{FieldManager: fieldManager}, "status"); err != nil {
		w.log.Warn("policy status not written", "policy", pkey, "err", err)
		return
	}
	w.mu.Lock()
	w.statusWritten[pkey] = verdict
	w.mu.Unlock()
}

func (w *Watcher) forgetStatus(pkey string) {
	w.mu.Lock()
	delete(w.statusWritten, pkey)
	w.mu.Unlock()
}

// fieldManager names the agent's writes (server-side apply, patches).
const fieldManager = "membrane-agent"

func namespacedResource(dyn dynamic.Interface, k kind, ns string) dynamic.ResourceInterface {
	r := dyn.Resource(crdKinds[k].gvr)
	if crdKinds[k].namespaced {
		return r.Namespace(ns)
	}
	return r
}

// pruneCRDPolicy queues a policy an earlier run imported from a custom
// resource the API server no longer has (so that the worker deletes it).
func (w *Watcher) pruneCRDPolicy(p *policy.Policy) {
	for k, c := range crdKinds {
		if c.policyKind != p.Kind {
			continue
		}
		if _, err := w.getCRD(k, p.Namespace, p.Name); apierrors.IsNotFound(err) {
			w.queue.Add(key2(k, p.Namespace, p.Name))
		}
	}
}
