package v2

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

const (
	// IdentityKind is the kind of a MembraneIdentity.
	IdentityKind = "MembraneIdentity"
	// IdentityPlural is its resource name.
	IdentityPlural = "membraneidentities"
)

// IdentityResource is the GroupVersionResource of MembraneIdentity.
var IdentityResource = Resource(IdentityPlural)

// MembraneIdentity is a cluster-wide security identity (Cilium's
// CiliumIdentity): cluster-scoped, its object name is the numeric
// identity in decimal and it holds the identity's label set. Agents
// create it with that name to allocate the number (so racing agents
// agree), record in Usage which nodes use it, and garbage collect it
// once no live node has used it for a grace period.
type MembraneIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`

	// SecurityLabels is the label set, "source:key" -> value (Cilium's
	// security-labels). It never changes after creation.
	SecurityLabels map[string]string `json:"security-labels"`
	// Usage maps the name of each node using the identity to the time
	// (RFC 3339) it last took its reference. A node removes its entry when
	// its last endpoint with the identity goes; entries of nodes whose
	// heartbeat lease expired are ignored by the garbage collector.
	Usage map[string]string `json:"usage,omitempty"`
}
