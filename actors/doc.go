// Package actors holds Membrane's actor system (github.com/asynkron/protoactor-go),
// one file per actor:
//
//	agent (root supervisor, agent.go)
//	├── datapath   bounded worker pool for blocking kernel/disk work (datapath.go)
//	├── ipam       bitmap allocators, owner and lease holder per IP (ipam.go)
//	├── ipcache    IP/prefix -> identity, written to the datapath (ipcache.go)
//	├── policy     policy repository, per-identity policy, policy file (policy.go)
//	├── identity   label set -> numeric identity, refcounted (identity.go)
//	├── endpoints  endpoint manager: IDs, supervision, index rows (endpointmanager.go)
//	│   └── ep-<id>  one actor per endpoint (endpoint*.go)
//	└── gc         orphan garbage collector (gc.go)
//
// Code outside this package drives the agent only through System's typed
// methods (frontdoor.go); messages/ is private to it.
//
// Actors never block: no netlink, BPF, disk call or wait inside a
// Receive. An actor that needs an answer (from another actor, the pool or
// the state store) uses its requester (request.go) and continues when the
// answer arrives as a message. Actors keep their state unexported; what a
// restarted actor needs is rebuilt from the index (pkg/domain/index),
// the table each actor is the single writer of.
//
// How it works (ARCHITECTURE.md has the map):
//
// `identity_cluster.go`, `identity_backend.go` — identities through a
// cluster-wide store (`Config.IdentityBackend identity.ClusterBackend`;
// nil keeps the node-local allocator: standalone mode, the simulator). The
// identity actor never calls the backend in Receive: a few worker
// goroutines (`backendWorkers`, bounded queues) make the calls, every call
// for one label set on the same worker so Acquire and Release reach the
// store in the order the actor decided them, and answer with a message. A
// label set's first local reference sends Acquire and every endpoint actor
// asking meanwhile waits on that one call (coalesced); a label set in use
// here is answered from the local references; the last local release sends
// Release. The backend's Watch feeds the identities other nodes allocated:
// bound in the actor, told to the policy actor (IdentityChanged) and
// written to the identities table with `Cluster` set and no local
// reference (GET /v1/identity shows them as remote). A failed Acquire
// answers its waiters with `ErrIdentityStoreUnavailable` (the endpoint
// shows it and retries with its own backoff); so is an Acquire still
// waiting for the store after `ClusterIdentityConfig.WaitMax` (half the
// request timeout: the store unreachable and the attempt hanging, or the
// label set waiting out its backoff), with the attempt going on (never a
// request parked past its caller's deadline). It publishes an
// `identity-waiting` event and retries with backoff
// (`ClusterIdentityConfig.Attempts`), at once when the backend's watch
// reports the store reachable again (`ClusterResumed`; the etcd backend
// sends it); endpoints with known identities never wait for the store. A
// label set the watch already reported, or a restored endpoint's own
// number (an agent restarted during an outage), is bound at once when the
// store fails, and the backend Acquire is retried (unbounded) until the
// store records the node's use. That Acquire, and a restored endpoint's,
// carries the number the endpoints hold (`identity.PreferringBackend`,
// which the etcd and the MembraneIdentity CRD backends implement): a label
// set the store collected meanwhile is created again with that number when
// it is free, so no endpoint keeps a number the store lost (the watch's
// removal of a number in use here asks the store again the same way); a
// store answer or watch event with another number (the label set renumbered by another
// node meanwhile) moves the node to the store's number (`renumber`): every
// local reference and lease moves at once, the holders are told
// (`IdentityRenumbered`) and regenerate through their actors, the old
// number is released in the store and the new one's use recorded, and an
// `identity-renumbered` event says so. With a store that numbers a label
// set once (`identity.SingleNumberBackend`, the etcd backend) an Acquire's
// answer replaces a number the watch still reports for its labels
// (`supersede`): the watch may be behind the store (re-listing after an
// etcd restart) but the answer, read in the write of the node's reference,
// is not. Reserved identities
// never reach it. A restart rebuilds local references and known identities
// from the index; a late answer for a label set nobody waits for any more
// is released again.
//
// `services.go` + `services_sync.go` — the services actor: the service
// table's single writer (one row per frontend, one source per frontend),
// service IDs (kept per frontend; at start read back from the pinned maps
// so translated connections keep their backends), one pool batch of map
// writes in flight, requests answered after the batch that wrote them,
// failed writes retried; `frontdoor_services.go` its front door
// (UpsertService(s), ReplaceServices, DeleteService, PruneServices,
// DumpServiceMaps).
//
// One way to wait. An actor that needs an answer — from another actor
// (`request`), from the pool (`inPool`) or from a goroutine outside the
// system such as the state store (`await`) — uses its `requester`
// (`actors/request.go`): it registers one answers process for its life,
// names it as the request's sender with a process-wide request number in
// the PID's `RequestId`, and the answer comes back, tagged, as a message
// in its own mailbox, where the request's continuation runs. A pending
// request has a deadline; one timer per requester, armed for the earliest,
// times them out. The one stale-answer guard: a restart or stop drops the
// pending requests, so an answer meant for a predecessor, or for a
// timed-out request, matches nothing. No actor uses protoactor futures or
// `ReenterAfter`. Outside the actors, the front door waits the same way
// through one asker process (`ask.go`).
//
// One writer per index table. The endpoint manager writes `endpoints`,
// IPAM writes `ipam`, identity writes `identities` and `identity-leases`,
// policy writes `policies` and `policy-revision`, ipcache writes
// `ipcache`. Writes are batched: the first change sends the actor a
// `flushIndex` message and everything queued before it goes as one group
// to the agent's single index writer (a row changed several times in one
// batch is written once). The writer applies every group queued meanwhile
// in one transaction, whole and in the order handed over (a snapshot never
// shows half a pass: refcounts agree with leases), then sends the groups'
// answers, so a caller always reads its own writes. Owners do not take
// memdb's write lock on their goroutine. An owner that panics hands its
// queued changes to the writer on the way out (`batcher.flushOnPanic`),
// and the root's strategy restarts it only once the writer has committed
// them (`commitThenRestart`: a replies-only group answered to the root
// actor), so the next incarnation rebuilds from its predecessor's writes
// without anyone waiting.
//
// Rows are immutable. The endpoint actor shares its current record with
// the index and writes through `mut()`, which copies first (copy-on-write;
// one record per endpoint at rest). Label sets are replaced, never
// changed: a record takes its identity's slice once the identity resolves,
// so endpoints with one label set share it.
//
// Index keys are fixed per row; records are swapped. The endpoints and
// ipam tables hold `swapRow`s (`pkg/domain/index/endpoint_row.go`): the
// indexed fields, fixed for the row's life, and an atomic pointer to the
// current immutable record. A write that changes no indexed field (a state
// transition, a claim) stores the new record in the row instead of
// rewriting every radix index (~50 µs and ~30 KB per endpoint row at
// 10,000 endpoints), so a lifecycle pays two endpoint-row writes (insert,
// delete), not six. A new endpoint is keyed under the identity its labels
// already have, so resolving it swaps too. Read transactions isolate
// indexed fields only: a reader sees a row's current record. Identities
// are never swapped: a reference count must agree with the identity-leases
// rows in every snapshot. Write and delete through
// `index.Insert`/`index.Delete`.
//
// Policy is derived state. Endpoints never persist their policy: every
// regeneration asks the policy actor (`ComputePolicy`) first. A policy or
// identity change recomputes only the identities whose subject or peer
// selector sets changed and sends a policy-only regeneration
// (`RegeneratePolicy`: no state write, realise only) to exactly the
// endpoints of identities whose policy changed, found through the
// endpoints that asked and the index (endpoints by identity). An endpoint
// is default-allow in a direction until a rule selects it for that
// direction. Rules live in the `policies` table (they survive a policy
// actor restart) and in `<state-dir>/policy.json`, written in the worker
// pool before an import or delete answers and read by `pkg/agent` at
// start, before restore.
//
// The ipcache has one writer. Endpoint actors (their addresses, on
// identity resolution and teardown), the policy actor (CIDR prefixes,
// local identities from 1<<24), the configured gateways and the host's own
// addresses (`actors.Config.HostAddrs` at start, then every change the
// datapath's netlink address watcher reports, `System.HostAddrChanged` ->
// `IPCacheHostAddr`; both host) and the sources of remote endpoints
// (`UpsertRemoteEndpoints`/`DeleteRemoteEndpoints`/`ChangeRemoteEndpoints`/`ReplaceRemoteEndpoints`,
// one claim per origin such as `k8s` or `kvstore`, with the hosting node
// as the entry's `TunnelEndpoint`) claim prefixes; a local endpoint's
// claim wins, then a remote endpoint's (between origins the first by
// name), then a policy CIDR's, then the host's. Front door calls are cut
// into messages of `RemoteBatch` endpoints, so no mailbox pass is long; a
// replacement is a run of them and only its last message sweeps the
// origin's claims the run did not set. Datapath writes go to the pool one
// batch at a time, so writes of one prefix never overtake each other. Once
// restore has re-created every endpoint, the agent sends `IPCachePrune`:
// one pool job (`datapath.IPCacheSyncer`) makes the pinned kernel map hold
// exactly the actor's entries, so entries of endpoints deleted while no
// agent ran do not outlive it.
//
// One loop writes the kernel. `reconciler.go`: an owner (ipcache, nodes,
// services) marks the keys whose desired state changed, or asks for a
// full sync (prune), and calls `sync` at the end of the message. Every
// marked key goes to the pool as one job (`reconcileOps.update`, or
// `prune`), capturing the desired state when the job is made; keys marked
// while it runs wait for the next one, so a burst coalesces and writes of
// one key never overtake each other. The answer comes back through the
// owner's requester. Failed keys are marked again and retried after
// `backoff(min, max, attempt)` (the timer's `reconcileRetry` is handled
// by `owner.lifecycle`, stopped on Stopping and Restarting) or with the
// next change. Only keys not yet written have a status (pending; failed
// with error and attempts), shown as `ActorSnapshot.Reconciler` in GET
// /v1/actors. `barrier` answers once a job covering every earlier change
// succeeded whole (IPCacheBarrier); `wait` answers after the job that
// wrote its keys, with their errors (service requests). Every node-wide
// actor (ipcache, nodes, services, policy, ipam, identity, gc) handles
// start, stop, its timers and index flushes through `owner`.
//
// Restarts rebuild from the index. A panicking endpoint actor is restarted
// in place (same PID, 5 restarts per 10 s, then stopped); the new
// incarnation reads its row and resumes (re-claim IPs and identity, both
// idempotent per holder, then regenerate; a deletion starts its steps
// over, all idempotent). The failed incarnation hands its waiters over
// through its own mailbox. IPAM, identity, policy and ipcache rebuild from
// their tables; a restarted policy actor (its registry slot records the
// restart) then reconciles every endpoint's policy. The endpoint manager
// is *resumed*, not restarted (the root's strategy recognises it by PID):
// protoactor stops all children of a restarting actor.
//
// Leases end when their holder stops. An endpoint actor that claims an
// address or an identity becomes its lease holder; when it stops, the
// endpoint manager (its parent, told by protoactor without a watch) sends
// IPAM and identity `holderStopped`, and they release what it still holds;
// a rebuilt IPAM or identity actor releases the leases of holders that no
// longer run. Deliberately not a death-watch: a watch costs every endpoint
// actor a watcher set and context extras (~600 B of heap each). A normal
// delete ends the leases explicitly first (NoIPRelease keeps the addresses
// reserved for their owner, without expiry; a delete drops exactly the
// identity references its actor took, NoIdentityRelease or not).
//
// Deletion is a state. A delete moves the endpoint actor from its live
// state (`receiveLive`) to the deleting one (`receiveDeleting`), which
// refuses new work (regenerations, label changes) with
// `ErrEndpointDeleting`, lets the work in flight end (a live continuation
// that finds the endpoint deleting stops there) and, after every message,
// runs the next of `deleteSteps` once nothing is in flight (`advance`).
// Order (the actor's `lifecycle`, `endpoint_delete.go`):
// disconnecting -> wait for in-flight work (datapath op, identity, proxy
// acks) -> datapath remove (idempotent, retried, else left to GC) -> state
// removal (flushed) -> leave the index (container ID and addresses become
// free in the manager's books) -> end IP lease -> end identity reference
// -> disconnected -> answer -> stop. While the row is in the index a
// second DELETE joins the first; once it is gone a DELETE answers 404,
// which CNI takes as done, so by then nothing may bring the endpoint back:
// a crash before the state removal restores it (and the retried DEL finds
// it), a crash after it leaves nothing in the kernel. A failed state
// removal fails the DELETE (`ErrStateStays`).
//
// Coalescing. At most one regeneration runs and one is pending per
// endpoint (`regenWant`: none, policy-only or full; a request raises it, a
// start consumes it); requests merged into the pending one bump the
// desired revision and all wait for it.
//
// Proxy waits do not block the mailbox. A regeneration whose datapath
// reports proxy redirects stays `regenerating` until every acknowledgement
// for its revision arrives (`ProxyAck` messages, sent by the front door
// straight to the endpoint's actor) or a timer message fires
// (`ProxyWaitTimeout`, then ready with a warning). A rejection (`ProxyAck`
// with `Rejected`, from `System.ProxyNack`) fails the regeneration with
// `ErrProxyRejected`, retried with backoff.
//
// A DNS answer is released after its addresses are realised. The proxy
// calls `System.LearnFQDN` (`frontdoor_fqdn.go`), which waits (bounded by
// the caller) outside the actors, ask after ask: the policy actor learns
// the answer (`policy_fqdn.go`: the FQDN cache, `SetFQDN`, which patches
// the policies peering the new addresses (`pkg/domain/policy`
// `mapchanges.go`), CIDR identities sent to the ipcache actor, the
// endpoints whose policy changed told to regenerate, the asker included);
// then, side by side, the ipcache actor answers a barrier once the
// datapath holds every change it had received (the policy actor's CIDR
// changes precede it in that mailbox), and the endpoint actor answers once
// the regeneration it owes or runs ended (`RegeneratePolicy` with `Join`:
// it started after the policy actor's request); unless the endpoint's
// index row then shows it realised exactly the policy the answer
// produced, it regenerates once more with the ask as a regeneration
// waiter (`RegeneratePolicy` with `Wait`). No actor
// holds DNS state per endpoint (heap per endpoint). Learned addresses
// expire with the TTL (the policy actor's one timer, stopped with the
// actor) and leave the ipcache and the policy maps. The cache persists
// in `<state-dir>/fqdn.json` (`restore.WriteFQDN` in the worker pool,
// one write in flight, at most one per `FQDNWriteGap`); at agent start
// the first incarnation restores what the file held and had not expired
// (`PolicyConfig.FQDNInitial`) before any endpoint asks for its policy.
//
// Operators read snapshots, never mailboxes. Every actor publishes what
// operators see into its registry slot (an endpoint actor after each
// message and continuation, only when something changed; the record is
// shared copy-on-write like the index row; top-level actors through a
// wrapper naming the message being handled). GET /v1/actors, /metrics and
// GET /v1/endpoint never `Ask` an actor, so a stuck actor is visible
// instead of making the query hang.
//
// `batch.go` batches an owner's index writes per mailbox pass;
// `index_writer.go` commits every owner's batches on one goroutine;
// `mailbox.go` is every actor's mailbox (protoactor's unbounded one
// without its per-message allocations, counting depth); `dispatcher.go`
// runs mailboxes on goroutines that wait for the next run; `introspect.go`
// is the `Registry` of actor snapshots behind GET /v1/actors and the
// `Observer` seam for metrics; `protoactor_internals.go` the slog logger
// factory and the compact process registry (the one place that touches
// protoactor's internals; `TestCompactRegistry` fails on an upgrade that
// changes them).
package actors
