package k8s

import (
	"context"
	"fmt"
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

// PodNamedPorts returns the named ports of pod's containers (and of its
// sidecars: init containers with restartPolicy Always), as Kubernetes
// resolves a NetworkPolicy's named port. A port the agent cannot carry
// (invalid name or protocol; the API server refuses those) is left out
// and logged.
func PodNamedPorts(pod *corev1.Pod, log *slog.Logger) policy.NamedPorts {
	var ps []policy.NamedPort
	add := func(c corev1.Container) {
		for _, cp := range c.Ports {
			if cp.Name == "" {
				continue
			}
			proto, err := policy.ParsePortProtocol(string(cp.Protocol))
			if err == nil {
				err = policy.ValidatePortName(cp.Name)
			}
			if err == nil && (cp.ContainerPort < 1 || cp.ContainerPort > 65535) {
				err = fmt.Errorf("port %d outside 1..65535", cp.ContainerPort)
			}
			if err != nil {
				log.Warn("container port left out", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "err", err)
				continue
			}
			ps = append(ps, policy.NamedPort{Name: cp.Name, Proto: proto, Port: uint16(cp.ContainerPort)})
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for _, c := range pod.Spec.Containers {
		add(c)
	}
	out, err := policy.NewNamedPorts(ps)
	if err != nil {
		log.Warn("named ports left out", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		return nil
	}
	return out
}

// podLabels returns PodLabels(pod, ns) without the labels the filter
// finds irrelevant to identity (Config.Labels): pods that differ only in
// those share one identity, and a selector on such a key selects nothing.
func (w *Watcher) podLabels(pod *corev1.Pod, ns *corev1.Namespace) labels.Labels {
	kept, dropped := w.filter.Apply(PodLabels(pod, ns, w.log))
	if len(dropped) > 0 && w.log.Enabled(context.Background(), slog.LevelDebug) {
		w.log.Debug("labels not relevant to identity", "pod", pod.Namespace+"/"+pod.Name, "labels", dropped.String())
	}
	return kept
}

// AuditAnnotation on a pod puts its endpoints in policy audit mode
// ("enabled" or "true"): what their policy would drop passes and is
// reported with the verdict audit (Cilium's per-endpoint
// PolicyAuditMode). Any other value or none: enforced.
const AuditAnnotation = "policy.membrane.io/audit-mode"

// PodPolicyAudit reports whether pod asks for policy audit mode.
func PodPolicyAudit(pod *corev1.Pod) bool { return auditEnabled(pod.Annotations) }

// NodePolicyAudit reports whether node asks for its host endpoint's
// policy audit mode (AuditAnnotation on the Node, as on a pod).
func NodePolicyAudit(node *corev1.Node) bool { return auditEnabled(node.Annotations) }

func auditEnabled(annotations map[string]string) bool {
	switch annotations[AuditAnnotation] {
	case "enabled", "true":
		return true
	}
	return false
}
