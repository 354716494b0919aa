// Package policy owns network policy: the rule formats the agent accepts
// (CiliumNetworkPolicy-shaped and Kubernetes NetworkPolicy), the rule
// repository with its revision, the selector cache (selector -> matching
// identities) and the computation of an endpoint's MapState, the set of
// {peer identity, port, protocol, direction} entries the datapath
// enforces. MapState is the seam to datapath/: the policy actor computes
// it, the endpoint actor carries it in its record, the datapath realises
// it (BPF policy map).
package policy
