package k8s

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/membrane-cni/membrane/pkg/domain/events"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// SourceAnnotation marks a policy document the agent imported from the API
// server (value "kubernetes"), so that a policy deleted while the agent
// was down is pruned at the next sync while policies PUT through the
// agent's API stay.
const SourceAnnotation = policy.SourceAnnotation

// Event reasons of the agent's verdicts on policy objects.
const (
	// ReasonPolicyRefused: the whole object is refused (its subject or
	// policy types cannot be understood); its previous version, if any,
	// stays in force.
	ReasonPolicyRefused = "PolicyRefused"
	// ReasonPolicyPartiallyRefused: parts of the object are refused and
	// allow nothing; the rest is in force and the pods it selects are
	// isolated in its directions.
	ReasonPolicyPartiallyRefused = "PolicyPartiallyRefused"
)

// parseOptions are the options Kubernetes policy objects compile with:
// namespace labels, partial refusal (nobody sees a refusal when the
// object is written, so a refused part must not leave the pods the
// object selects unisolated), and L7 and DNS rules refused as fields
// when this agent runs no proxy for them.
func (w *Watcher) parseOptions() policy.ParseOptions {
	return policy.ParseOptions{NamespaceLabels: true, PartialRefusal: true,
		NoL7: w.sys.Config.NoL7, NoDNSProxy: w.sys.Config.NoDNSProxy, NodeSelectorLabels: w.sys.Config.NodeSelectorLabels,
		SecretsNamespace: w.sys.Config.PolicySecretsNamespace}
}

// convertPolicy turns a NetworkPolicy into the policy repository's input
// by way of the policy parser (one parser for both doors): the document
// keeps name, namespace, labels and spec, and gets SourceAnnotation.
// Returns an error wrapping policy.ErrInvalidPolicy for a policy the
// agent refuses as a whole; parts refused with opts.PartialRefusal are
// in the result's Refused.
func convertPolicy(np *networkingv1.NetworkPolicy, opts policy.ParseOptions) (*policy.Policy, error) {
	doc := map[string]any{
		"apiVersion": policy.APIVersionKNP,
		"kind":       policy.KindKNP,
		"metadata": map[string]any{
			"name": np.Name, "namespace": np.Namespace, "labels": np.Labels,
			"annotations": map[string]string{SourceAnnotation: "kubernetes"},
		},
		"spec": np.Spec,
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("convert networkpolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	pols, err := policy.ParseWith(b, opts)
	if err != nil {
		return nil, fmt.Errorf("convert networkpolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	return pols[0], nil
}

// fromKubernetes reports whether p was imported from the API server.
func fromKubernetes(p *policy.Policy) bool {
	var d struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	return json.Unmarshal(p.Raw, &d) == nil && d.Metadata.Annotations[SourceAnnotation] == "kubernetes"
}

// recordRefusal reports a refusal of the policy object obj (pkey in the
// repository): counted (GET /v1/status k8s.policy-errors, or
// policies-partial), logged, published on the agent's event stream and
// recorded as a Warning event on the object. err is the refusal of the
// whole object; without it p.Refused lists the refused parts.
func (w *Watcher) recordRefusal(obj runtime.Object, kind, ns, pkey string, p *policy.Policy, err error) {
	reason, msg := ReasonPolicyRefused, ""
	w.mu.Lock()
	if err != nil {
		w.policyErrors++
		msg = fmt.Sprintf("refused, not in force (an earlier version stays in force): %v", err)
	} else {
		w.policiesPartial++
		reason = ReasonPolicyPartiallyRefused
		msg = "in force; its pods are isolated, these parts allow nothing: " + p.RefusedSummary()
	}
	w.mu.Unlock()
	w.log.Error("policy refused", "kind", kind, "policy", pkey, "reason", reason, "detail", msg)
	w.sys.Events().Publish(events.Event{Type: events.PolicyRefused, Namespace: ns,
		Message: fmt.Sprintf("%s %s %s", kind, pkey, msg)})
	w.events.Eventf(obj, corev1.EventTypeWarning, reason, "node %s: %s", w.cfg.NodeName, msg)
}
