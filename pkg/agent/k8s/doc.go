// Package k8s makes the agent a Kubernetes node agent (outer ring): it
// watches the pods of its node, namespaces and NetworkPolicies through
// client-go shared informers and drives the actor system through its front
// door. Pod and namespace labels become endpoint labels in Cilium's naming
// (PodLabels); a CNI ADD takes the cached pod's labels (Watcher.Labels),
// or the reserved init identity when the pod is not cached in time, and a
// later change relabels the endpoint. NetworkPolicies, MembraneNetworkPolicies
// and MembraneClusterwideNetworkPolicies (crdpolicy.go; verdict on their
// status.nodes[node] and as events) are imported into the policy
// repository and deleted from it as they come and go. conn.go reports the
// API server connection.
//
// Towards the cluster: each local pod endpoint is published as a
// MembraneEndpoint (endpoints.go), other nodes' MembraneEndpoints enter
// the ipcache as remote endpoints (remote.go), and Node objects give this
// node's pod CIDRs and address and the other nodes (nodes.go).
//
// Trust: another node's MembraneEndpoint is believed only as a claim of
// the node its membrane.io/node label names (objects without the label
// are not watched), while that node's Node object exists, its
// spec.podCIDRs hold every claimed address, its status.addresses hold the
// claimed node IP, and the identity is not a reserved one
// (endpoint.Remote.CheckOwner). Refused objects are logged once per
// reason, counted (RefusedRemoteClaims) and checked again whenever their
// Node changes. The ipcache ranks these claims below this node's own
// endpoints and reserved addresses.
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
