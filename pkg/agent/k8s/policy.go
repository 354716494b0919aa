package k8s

import (
	"encoding/json"
	"fmt"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// SourceAnnotation marks a policy document the agent imported from the API
// server (value "kubernetes"), so that a policy deleted while the agent
// was down is pruned at the next sync while policies PUT through the
// agent's API stay.
const SourceAnnotation = "membrane.io/source"

// convertPolicy turns a NetworkPolicy into the policy repository's input
// by way of the policy parser (one parser for both doors): the document
// keeps name, namespace, labels and spec, and gets SourceAnnotation.
// Returns an error wrapping policy.ErrInvalidPolicy for a policy the
// agent does not support.
func convertPolicy(np *networkingv1.NetworkPolicy) (*policy.Policy, error) {
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
	pols, err := policy.ParseWith(b, policy.ParseOptions{NamespaceLabels: true})
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
