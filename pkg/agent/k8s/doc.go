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
//
// How it works (ARCHITECTURE.md has the map):
//
// `pkg/agent/k8s` — Kubernetes mode (Config.K8s non-nil): client-go
// informers on this node's pods, namespaces and NetworkPolicies, and
// dynamic informers on the policy custom resources (`crdpolicy.go`:
// MembraneNetworkPolicy and MembraneClusterwideNetworkPolicy through the
// policy parser, verdict merge-patched into `status.nodes[node]`, refusals
// as events), started and synced before the API is ready; `Watcher.Labels`
// is the API's endpoint labeler (pod labels on ADD, or reserved:init after
// a bounded wait); the workqueue's workers (4; one object never on two at
// once) relabel endpoints (`PatchLabels`) and imports/deletes policies
// (`ImportPolicy`/`DeletePolicy`) through the front door. Informer
// callbacks only queue keys, and only for a change the agent derives
// something from. `crdpolicy.go` handles the policy custom resources;
// `conn.go` probes `/readyz` for the connection state of GET /v1/status.
// Towards the rest of the cluster (`cluster.go` wires them):
// `endpoints.go` writes one `MembraneEndpoint` per local pod endpoint
// (type in `apis/v2/endpoint.go`, CRD in `deploy/crds/`); `remote.go`
// mirrors other nodes' objects into the ipcache through a `RemoteSink`
// (the front door's remote endpoint methods); `nodes.go` follows Node
// objects (this node's address and pod CIDRs, `WaitPodCIDRs` for `--ipam
// kubernetes` in `pkg/agent/podcidr.go`; the others to a `NodeSink`, the
// system's `SyncNodes` where it has one). `services.go` +
// `service_translate.go`: the `ServiceWatcher` (Service, EndpointSlice and
// this Node's informers, its own queue and worker) translates a Service
// into service-table frontends (ready endpoints, ports by name, traffic
// policies Local, NodePort with `KubeProxyReplacement`) and writes them
// through `ReplaceServices` at sync, then `UpsertServices`/`DeleteService`
// per changed Service. `apis/v2` holds the custom resources' Go types (no
// codegen: dynamic client and unstructured); the policy CRDs in
// deploy/crds/ are generated from them by its test (`-update`). Its tests
// run a real kube-apiserver (`test/kubetest`, binaries from
// `scripts/kube-bin.sh`, built from `tools/kube`, a separate module so
// that the agent's go.mod never requires k8s.io/kubernetes).
//
// Kubernetes writes (`pkg/agent/k8s/endpoints.go`): the endpoint status
// objects are written by one workqueue worker, never by an actor. Its
// triggers are the event hub's endpoint events (created, state changed,
// deleted), each queued 200 ms later so a regeneration's several state
// changes become one write and the index commit that follows the event is
// done when the worker reads; the truth it writes is the index row,
// compared with the cached object (no write when equal). A full pass every
// 30 s, and one after a `missed` marker, repairs what an event could not
// say. Writes go through a client of their own limited to 20/s. The hub
// and the index were chosen over a go-memdb watch (not used anywhere,
// test/arch) and over hooks in the endpoint actors (which must not do
// I/O).
//
// Remote endpoints are held slim: the other nodes' objects are read by a
// client-go reflector into a store of our own (`remoteEndpoints`, a
// `cache.ReflectorStore`), which keeps per object only its addresses,
// identity and (interned) node; an informer's store would keep the whole
// object or an `ObjectMeta` per object. A relist is a
// `ReplaceRemoteEndpoints`; the reflector never waits for the actors (one
// worker hands over dirty keys in rounds). Their identity numbers are the
// writing agent's: they agree across nodes once identities are
// cluster-wide.
//
// An unchanged Kubernetes object regenerates nothing. A relist or resumed
// watch after an API outage, or the agent's own status write, delivers
// updates that change nothing the agent derives from (labels,
// NetworkPolicy resourceVersion, CRD generation and labels); the informer
// handlers drop them before the queue, since a re-import regenerates every
// endpoint a policy selects.
package k8s
