// Package policy owns network policy: the rule formats the agent accepts
// (CiliumNetworkPolicy-shaped and Kubernetes NetworkPolicy), the rule
// repository with its revision, the selector cache (selector -> matching
// identities) and the computation of an endpoint's MapState, the set of
// {peer identity, port, protocol, direction} entries the datapath
// enforces. MapState is the seam to datapath/: the policy actor computes
// it, the endpoint actor carries it in its record, the datapath realises
// it (BPF policy map).
//
// Invariants: a namespaced policy's subject (endpointSelector,
// podSelector) selects endpoints of its own namespace only, whatever the
// selector says about the namespace label (compileSelector,
// scopeConfined); only cluster-wide kinds select across namespaces. Peers
// keep their format's semantics: a NetworkPolicy peer leaves its
// namespace only through namespaceSelector, a CNP peer that names the
// namespace label (or only reserved labels) may select any namespace, as
// in Cilium. A part of a document the agent refuses never widens what is
// allowed: strictly parsed documents (PUT /v1/policy) are refused whole;
// with ParseOptions.PartialRefusal (Kubernetes objects) the refused entry
// or direction allows nothing while the subject stays isolated
// (refuse.go).
package policy
