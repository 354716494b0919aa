// Package k8s makes the agent a Kubernetes node agent (outer ring): it
// watches the pods of its node, namespaces and NetworkPolicies through
// client-go shared informers and drives the actor system through its front
// door. Pod and namespace labels become endpoint labels in Cilium's naming
// (PodLabels); a CNI ADD takes the cached pod's labels (Watcher.Labels),
// or the reserved init identity when the pod is not cached in time, and a
// later change relabels the endpoint. NetworkPolicies, MembraneNetworkPolicies
// and MembraneClusterwideNetworkPolicies (crdpolicy.go; verdict on their
// status.nodes[node] and as events) are imported into the policy
// repository and deleted from it as they come and go. They compile with
// partial refusal (Watcher.parseOptions): a part the agent refuses (a
// named port, L7 rules without a proxy, an unknown field in a rule)
// allows nothing while the rest is in force, so the pods such an object
// selects are isolated, never left open; only an object whose subject or
// directions cannot be understood is refused whole. Both are reported as
// Warning events on the object (PolicyPartiallyRefused, PolicyRefused),
// on the agent's event stream (policy-refused), in GET /v1/status and,
// for the custom resources, on status.nodes[node]. conn.go reports the
// API server connection.
//
// Towards the cluster: each local pod endpoint is published as a
// MembraneEndpoint (endpoints.go), other nodes' MembraneEndpoints enter
// the ipcache as remote endpoints (remote.go), and Node objects give this
// node's pod CIDRs and address and the other nodes (nodes.go).
//
// Invariants: informer callbacks never block (they only queue keys, and
// only for changes the agent derives something from: a relist after an
// API outage regenerates nothing); labels and policies are applied by
// defaultWorkers workers of one workqueue, which never hands one object
// to two workers, and one worker per other concern (endpoint status
// writes, remote endpoints, nodes) applies its queue in order, so two
// changes of one pod never race; the k8s label source of a pod's endpoints is owned
// by this package; nothing here runs inside an actor.
package k8s
