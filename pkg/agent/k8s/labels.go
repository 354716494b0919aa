package k8s

import (
	"log/slog"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// Label keys (source k8s) the agent derives from a pod, as Cilium names
// them.
const (
	// LabelNamespace is the pod's namespace.
	LabelNamespace = policy.NamespaceLabel
	// LabelServiceAccount is the pod's service account.
	LabelServiceAccount = "io.cilium.k8s.policy.serviceaccount"
	// LabelNamespaceLabels prefixes every label of the pod's namespace.
	LabelNamespaceLabels = policy.NamespaceLabelsPrefix
)

// initLabels is the label set of the reserved init identity.
var initLabels, _ = identity.ReservedLabels(identity.ReservedInit)

// PodLabels returns the endpoint labels of pod in namespace ns (nil: not
// known): every pod label as k8s:<key>=<value>, the namespace, the service
// account and every namespace label under LabelNamespaceLabels. A label
// the agent cannot carry (too long once prefixed, or a key pod labels may
// not override) is left out and logged.
func PodLabels(pod *corev1.Pod, ns *corev1.Namespace, log *slog.Logger) labels.Labels {
	out := make([]labels.Label, 0, len(pod.Labels)+4)
	add := func(key, value string) {
		l := labels.Label{Source: labels.SourceK8s, Key: key, Value: value}
		if err := l.Validate(); err != nil {
			log.Warn("pod label left out", "pod", pod.Namespace+"/"+pod.Name, "label", labels.Clip(key), "err", err)
			return
		}
		out = append(out, l)
	}
	for _, k := range sortedKeys(pod.Labels) {
		if reservedKey(k) {
			log.Warn("pod label left out: the agent sets this key", "pod", pod.Namespace+"/"+pod.Name, "label", k)
			continue
		}
		add(k, pod.Labels[k])
	}
	add(LabelNamespace, pod.Namespace)
	if sa := pod.Spec.ServiceAccountName; sa != "" {
		add(LabelServiceAccount, sa)
	}
	if ns != nil {
		for _, k := range sortedKeys(ns.Labels) {
			add(LabelNamespaceLabels+k, ns.Labels[k])
		}
	}
	ls, err := labels.New(out...)
	if err != nil { // every label validated and keys unique: a bug
		log.Error("pod labels", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		return nil
	}
	return ls
}

// reservedKey reports whether a pod label key would collide with a key the
// agent derives (a pod must not claim another namespace).
func reservedKey(k string) bool {
	return k == LabelNamespace || k == LabelServiceAccount || len(k) >= len(LabelNamespaceLabels) && k[:len(LabelNamespaceLabels)] == LabelNamespaceLabels
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// desiredLabels is an endpoint's label set given its pod's: base keeps
// every label of another source than k8s (cni:network=...), the pod's
// labels replace all k8s ones. reserved:init never stays.
func desiredLabels(base, pod labels.Labels) labels.Labels {
	keep := make(labels.Labels, 0, len(base)+len(pod))
	for _, l := range base {
		if l.Source != labels.SourceK8s && l.Source != labels.SourceReserved {
			keep = append(keep, l)
		}
	}
	return keep.Add(pod)
}

// diffLabels returns what PatchLabels must add to and delete from cur to
// reach want (deletions name keys want does not have).
func diffLabels(cur, want labels.Labels) (add, del labels.Labels) {
	for _, l := range want {
		if v, ok := cur.Get(l.Source, l.Key); !ok || v != l.Value {
			add = append(add, l)
		}
	}
	for _, l := range cur {
		if _, ok := want.Get(l.Source, l.Key); !ok {
			del = append(del, labels.Label{Source: l.Source, Key: l.Key})
		}
	}
	return add, del
}
