// Package datapath is the only package that touches the kernel. It defines
// the Datapath interface the agent's actors drive (always from the bounded
// worker pool, never from inside an actor's Receive) and a Fake that runs
// anywhere, in memory, with hooks to inject errors, delays and proxy
// acknowledgement behaviour. The Linux implementation (netlink, network
// namespaces, veths, eBPF programs) lives in *_linux.go files. Every
// operation is idempotent: realising twice changes nothing, removing a
// missing endpoint is success.
//
// How it works (ARCHITECTURE.md has the map):
//
// `datapath/` — the `Datapath` interface, the in-memory `Fake` (hooks for
// errors, delays, proxy acks) and the Linux datapath (`linux*.go`: host
// veth settings, /32 and /128 routes, the `membrane_host` device holding
// each range's gateway — chosen over proxy ARP; IPv6 gateways answered by
// proxy NDP entries per host veth and pods entered as permanent
// neighbours, `linux_neigh_linux.go` — and deferred host-side teardown).
// Details: docs/cni-notes.md. Its BPF side is `bpf_*.go`: `bpf_loader`
// (template parsed once; the two endpoint programs loaded once per node
// with the shared maps and pinned under `<bpffs>/programs/<object
// digest>/`, reused by a restarted agent of the same build, loaded again
// after an upgrade), `bpf_maps` (shared maps, policy map sync by
// difference, or by the patched peers' entries alone for a policy
// patched from the one realised, ipcache keys, drop counters), `bpf_cidr` (the CIDR policy
// map: keys, read-back, sync by difference in an order that never allows
// what neither side allows), `bpf_attach` (endpoint veths: clsact +
// cls_bpf filters replaced in place, by default, or TCX links with
// `--bpf-attach tcx`; shared devices: TCX links updated in place, cls_bpf
// where TCX is missing or with `--bpf-attach tc`), `bpf_slots` (the outer
// maps' slots: 64 kept filled off the ADD's path with one batch update per
// outer map, emptied in the worker pool after a DEL with releases made at
// once sharing one batch delete per outer map, a previous agent's spares
// emptied at start), `bpf_adopt` (a restarted agent keeps attachments that
// run the node's current programs, compared by program ID), `bpf_endpoint`
// (Realize/ Remove/DumpPolicy: an endpoint's entry in the per-node
// `endpoints` map, keyed by its host veth's ifindex, naming its slot of
// the `policy_maps` and `cidr_maps` outer maps), `bpf_prepare`
// (`datapath.Preparer`: a new endpoint's slot taken and its maps pinned in
// the worker pool, beside the Realize's host routes and sysctls while the
// state is written; phases timed through `LinuxHooks.Phase`), `bpf_events`
// (drop ring buffer -> `LinuxHooks.OnDrop`, which `pkg/agent/drops.go`
// turns into `datapath-drop` events and the Prometheus drop counter, and
// the flow log too), `bpf_flows` + `flows.go` (the `flows` ring buffer:
// one `FlowEvent` per new connection -> `LinuxHooks.OnFlow`, the
// `flow_config` switch `SetFlows` writes, the per-CPU loss counters
// `FlowStats` sums), `bpf_fs` (bpffs mount only at /sys/fs/bpf, pin layout), `bpf_ct` (an
// endpoint's conntrack entries flushed on Remove), `bpf_ctgc` + `ctgc.go`
// (the conntrack collector goroutine: bounded passes over the `ct` map,
// interval adapted to the dead share); `hostaddrs_linux.go` (the host
// address watcher); `nsmount/` (netns bind-mount removal, shared with test
// helpers); `linux_ipcache_linux.go` (ipcache writes, `SyncIPCache` prune,
// `HostAddrs`); `drops.go` the `DropEvent` types; `linux_gc_linux.go` the
// orphan sweep of veths and `<bpffs>/endpoints/<id>` pins;
// `health_linux.go` the health endpoint's netns and veth; `nodes.go`
// (`RemoteNode`, `NodeRouter`, `ValidateNodes`), `linux_nodes_linux.go`
// (cross-node routing: native routes per remote pod CIDR via the node's
// address, or the VXLAN device in external mode with the overlay programs
// on it and the `tunnel` map; routes marked with rtm_protocol 0x4d so a
// sync finds its own, also a previous agent's), `linux_masq_linux.go`
// (masquerade: the nftables table `inet membrane`). Notes:
// docs/bpf-notes.md.
//
// Sources of nodes ("file": `--nodes-file`; "k8s": the Node watcher of
// Kubernetes mode; the kvstore feeds the same front door) -> the nodes
// actor (union, index rows behind `GET /v1/nodes`) ->
// `NodeRouter.SyncNodes` in the worker pool.
//
// Native routing (`--routing native`): one route per remote pod CIDR via
// that node's address of the CIDR's family. A remote source's identity is
// the ipcache's for its address (remote endpoints enter the ipcache
// through the remote/kvstore/k8s branches; unknown is world).
//
// Tunnel (`--routing tunnel`, the default, as Cilium's): one VXLAN device
// in external (collect_md) mode made through netlink, NOARP, port 8472,
// MTU 1450; remote pod CIDRs routed into it (scope link). The routes POST
// /v1/attach puts in a pod carry the tunnel's MTU when it is below the
// veth's (`api.Config.TunnelMTU`, Cilium's route MTU), so the pod's stack
// leaves room for the encapsulation; in native routing they carry the
// veth's. The kernel's
// neighbour entry on a NOARP device carries the device's own MAC, so
// `from_overlay` marks decapsulated frames PACKET_HOST for the stack to
// route them. The outer destination comes from the ipcache entry's tunnel
// endpoint (a remote endpoint's node) or, for addresses the ipcache does
// not know, from the `tunnel` map (remote pod CIDR -> node, Cilium's old
// tunnel map), so pods reach each other before any remote endpoint is
// known. The VNI carries the source identity (24 bits; the sending node's
// host identity goes as world: the receiver must not take it for its own
// host). The receiving side hands it to the endpoint programs in skb->mark
// (low byte 0x4d, identity in the upper 24 bits); a pod cannot forge it
// (the veth crossing scrubs the mark).
//
// Pod to pod across nodes in tunnel mode skips both nodes' IP stacks
// (issue 39, Cilium's BPF host routing for the overlay): from_container
// sends a pod's packet for a remote pod straight to the tunnel device's
// egress (`remote_direct` in bpf/endpoint.c, the same `local_deliver`
// FIB lookup, TTL and MAC rewrite; to_overlay then sets the tunnel key
// as before), and the receiving node's from_overlay, after its trust
// checks and with the identity in the mark, sends it straight to the
// destination endpoint's host veth (`overlay_deliver` in
// bpf/overlay.c, mark `MARK_IDENTITY_DIRECT_MAGIC`), where to_container
// gives its verdict as before. Each node's netfilter sees a connection
// in both directions or in neither, never one alone (kube-proxy drops
// what its conntrack finds INVALID in FORWARD): both sides take TCP and
// UDP only (an ICMP echo sent directly would meet its reply alone in the
// node's conntrack) and require the
// remote address (destination on the way out, source on the way in) to
// be in the node's or the cluster's pod CIDRs (`node_config.pods`:
// never masqueraded, never a kube-proxy frontend) and the device to be
// the one whose from_overlay delivers directly (`node_config.
// tunnel_ifindex`, written once the overlay programs are attached);
// from_container goes on the conntrack rule of local delivery (its own
// connection begun by a SYN or not TCP, `CT_F_OPENED`; a reply only of
// a connection whose requests came directly, `CT_F_DIRECT`); from_overlay
// delivers a reply of the endpoint's own connection with `CT_F_OPENED`
// (its entry names this source: its requests left untranslated), a TCP
// SYN without ACK, and later packets of a connection whose entry has
// `CT_F_DIRECT`. Everything else goes up the stack: replies of a
// connection netfilter translated on the way out (kube-proxy's DNAT of a
// ClusterIP, which the endpoint's entry names instead of the backend),
// UDP and other protocols the remote side began (a UDP reply of a
// translated request cannot be told from a request), fragments, IPv6
// extension headers, TTLs running out, packets too big for the veth
// (`TestTunnelDirect`). These rules are bpf/forward.h's
// (`fwd_direct_conn`, `fwd_redirect`, `fwd_ttl_dec`), shared with native
// routing.
//
// Native routing does the same through the uplinks (Cilium's BPF host
// routing): Init attaches from_netdev to `Services.Devices` (detected as
// for the kube-proxy replacement when empty: the up devices holding a
// global unicast address) also without the kube-proxy-free mode or the
// host firewall, then writes their ifindexes to `node_config.uplinks`
// (the first 4; the others go through the stack). from_container sends
// a pod's TCP or UDP packet for a remote pod that the FIB routes out of
// one of them straight there (`bpf_redirect_neigh` to the route's
// gateway, the other node); from_netdev's `netdev_deliver` sends the
// other direction straight to the endpoint's host veth, marked
// `MARK_DIRECT_MAGIC` (the identity is the ipcache's for the source
// address, as for a packet the stack forwarded), on the same rules as
// from_overlay plus one: the source's own route, looked up from the
// endpoint's veth, must leave through an uplink (a strict reverse-path
// check: a local pod's address, spoofed from the underlay, goes up the
// stack, whose rp_filter or rpfilter match decides as before;
// `TestNativeDirect`, `TestNativeDirectSpoofedSource`). With the
// kube-proxy-free mode or the host firewall, from_netdev translates
// NodePorts and runs the host firewall first (without them
// `node_config.netdev_flags` says NETDEV_F_DELIVER_ONLY); those take node
// addresses, never pods'. A reply
// arriving on a device that is not an uplink goes through the stack
// while its request did not: multi-homed nodes list every uplink.
//
// The device is created lazily on the
// first tunnel-mode sync, so an agent with no remote nodes adds no link; a
// native-mode sync removes one an earlier tunnel-mode run left.
//
// Masquerade (`--masquerade`, on by default): traffic from this node's
// pod CIDRs (and `--cluster-cidr`) to anything outside the cluster's pod
// CIDRs (`--cluster-cidr`, this node's, and every remote node's as
// SyncNodes hands them over; at Init the node routes a previous agent
// left) is SNATed to the outgoing interface's address. nftables, not BPF. SNAT
// needs a connection table with port allocation and the reverse
// translation of replies before the endpoint programs see them; the
// kernel's conntrack + `masquerade` (which also picks the outgoing
// interface's address and follows its changes) does all of it, where a BPF
// SNAT would be a second NAT engine with its own port allocator and GC.
// The cost is one nftables rule walk per new connection leaving the
// cluster, not per pod-to-pod packet (those return at the first rules).
// The table `inet membrane` is Membrane's whole; its chain is rewritten
// in one transaction at Init and when the nodes change (netlink,
// github.com/google/nftables; no `nft` binary needed).
//
// BPF pins live under `--bpffs` (default /sys/fs/bpf/membrane): shared
// maps `ipcache`, `ct`, `drops`, `events`, `endpoints_by_ifindex`,
// `policy_maps`, `cidr_maps` and the service maps `lb_*` directly under
// it, the node's two endpoint programs under `programs/<object digest>/`;
// each endpoint's `policy` and `cidr` maps (and, in TCX mode, its links)
// under `endpoints/<id>/` and nothing else there (GC removes directories
// that name no live endpoint, with their `endpoints` entries and slots).
// An endpoint's rows in the shared `ct` and `drops` maps go with its
// Remove (and with GC of its directory), so a later endpoint with the same
// ID inherits neither connections nor counters. Pinned programs, links and
// maps keep traffic enforced while no agent runs; a new agent of the same
// build reuses the pinned programs (same object digest, same shared maps)
// and adopts every attachment running them (same program IDs); after an
// upgrade it loads the new object once and swaps it in per endpoint with
// `link.Update` or a cls_bpf filter replace, never detaching. A pinned
// shared map of another layout is replaced by a new one (the running
// programs keep theirs); the `endpoints_by_ifindex` map of the layout
// before the addresses has its entries carried over, so that its endpoints
// keep their slots (`openEndpointsMap`). The agent keeps two file
// descriptors per endpoint (its policy maps); the outer maps, pins and the
// cls_bpf filters hold the rest.
//
// Policy-only changes never reload a program. Enforcement per direction is
// an entry of the policy map (`{0xffffffff, dir}`), not a program
// constant; Realize diffs the wanted `MapState` against what the map holds
// (enforcement off first, adds, removes, enforcement on last). The
// endpoint's `endpoints` entry also says which directions may be enforced
// (`ENDPOINT_F_ENFORCE_KNOWN` with `_INGRESS`, `_EGRESS`), so that the
// programs skip the enforce entry's lookup, per packet, for the others:
// Realize sets a direction's flag before the sync writes its enforce
// entry (`failClosed` sets both before its deny-all) and clears it after
// the sync removed it; an entry without `KNOWN` (an earlier build's, a
// previous agent's at its first realize, the host endpoint's) leaves it
// to the lookup (`TestBPFEnforceFlags`). No endpoint
// change loads a program: a new identity rewrites the endpoint's
// `endpoints` entry, a new interface writes one and attaches the node's
// programs there.
//
// Services are translated before policy. A packet a pod sends to a
// frontend gets its backend as destination in the pod's from-container
// program before conntrack and the policy lookup, so egress policy sees
// the backend's identity and the backend's ingress policy the client's
// address; kube-proxy (if installed) never sees a cluster address, as TCX
// ingress runs before netfilter. Established connections keep their
// backend after it leaves the service (drained, not reset); a new
// connection (TCP SYN, or an unknown flow) never picks a removed one.
// Three places translate, each because the others cannot see its traffic:
// per packet at the pod's veth (every pod has its program already, and
// policy must see the backend there); at the socket for host processes
// (`bpf/sock.c`, cgroup connect/sendmsg/recvmsg/ getpeername: a host
// process's packets meet no Membrane program before the stack routes them,
// and translating once per connection at connect() beats per-packet DNAT);
// per packet at the uplink for NodePort traffic from outside
// (`from_netdev`: no socket of ours exists there). The socket hooks run
// only in the kube-proxy-free mode and only on the configured cgroup (a
// hook on the root cgroup acts on every process of the node, so tests
// attach to a cgroup of their own). They never make a pod's flow translate
// twice: a socket they translated sends to the backend, which the pod's
// program finds in no frontend. With kube-proxy
// (`--kube-proxy-replacement=false`) neither the socket programs nor
// `from_netdev` is attached, and Init detaches pinned ones. Measured with
// both in the same runs (BENCHMARKS.md "kube-proxy-free mode"): a host
// process's connect() to a ClusterIP p50 0.87-1.13x of kube-proxy-shaped
// iptables DNAT and its stream throughput 0.81-1.08x (parity within this
// loaded machine's noise: the gain is no per-packet NAT or conntrack and
// no kube-proxy, not a faster connect()); NodePort from outside at parity
// with kube-proxy's rules at the median. The veth path against iptables
// DNAT for pods: BENCHMARKS.md "Services (issue 19)".
//
// Replies are reverse-translated only for connections the datapath
// translated. The frontend of a reply is found by the reply's tuple
// (`lb_revnat`), which a later connection from the same client address
// and port to the same backend shares without any translation (a pod
// dialling the backend pod, a client outside routed to the pod's address,
// kube-proxy's DNAT), so the conntrack entry decides, as Cilium's rev-NAT
// index does: `ct_record` keeps in the entry's flags whether the
// connection's packets were Service-translated (`CT_F_SVC`, the client
// pod's entry) or arrived NodePort-translated (`CT_F_NODEPORT`, the local
// backend's entry; `from_netdev` marks the request), following each
// packet of the original direction, and only a reply whose entry says so
// is translated. The flags take the high half of what was a 64-bit packet
// counter (on little-endian machines), so the pinned `ct` map keeps its
// size and its entries across an upgrade: an earlier build's entries
// (flags 0) are reverse-translated by the tuple alone, as before, until
// their client's next packet. The other way round, a pod's reply is
// never taken for a new Service connection: a packet to a frontend that
// conntrack knows as a reply of a connection the pod's peer opened
// (`ct_peer_opened`) is left alone, since a peer may well use a
// frontend's address and port as its own (the node's address and a
// NodePort or hostPort: a host process bound there, or a masquerade
// with random ports, as kube-proxy's `--random-fully` in
// `TestKPRBench`).
//
// NodePort replies never go through the stack's forwarding. A reply whose
// source becomes the node's own address (a local backend's reply,
// translated in `nodeport_reply` after its from-container's policy, a
// remote backend's reply translated on the uplink) is sent by
// `bpf_fib_lookup` + `bpf_redirect_neigh`: the stack would drop a
// forwarded packet with a local source address as martian. The request to
// a local backend does go through the stack (its source is the client's).
//
// Pod to pod on one node skips the host's stack (`local_deliver` in
// bpf/endpoint.c, Cilium's direct local delivery): when a pod's
// from_container lets out a packet whose FIB route is another local
// endpoint's host veth, it decrements the TTL, writes the MAC addresses
// and redirects it to that veth's egress (`bpf_redirect`, or
// `bpf_redirect_neigh` while the neighbour is unresolved), where the
// destination's to_container gives its verdict as before: ingress policy,
// audit, drops, flows, L7 redirects and conntrack are the same programs on
// the same hook. What the host's stack did on the way is skipped: routing
// past the FIB lookup, netfilter (iptables FORWARD rules and conntrack do
// not see such traffic, as with Cilium's), the neighbour output. Unlike
// Cilium, the destination's verdict is not tail-called into the sender's
// program followed by `bpf_redirect_peer` into the pod's netns: that
// skips the destination veth's transmit, and with it the qdisc a chained
// bandwidth plugin puts there to shape what reaches the pod
// (`chainBandwidth`), so same-node traffic would escape the pod's ingress
// rate. Measured (issue 39, `TestSameNodeNumbers`), the peer redirect
// gained nothing this machine could resolve over the veth's egress.
// Replies come back directly only
// when their requests did: to_container records a packet marked
// `MARK_DIRECT_MAGIC` as `CT_F_DIRECT` (following each packet of the
// original direction, like the other flags), and from_container delivers
// a reply directly only with that flag; a request the host's stack
// carried may have been translated by netfilter (kube-proxy's DNAT of a
// ClusterIP to the pod), whose reply must cross the stack to be reversed
// (`TestLocalDelivery`). A pod's own connection goes directly only when
// its conntrack entry was created by a packet that begins one (a TCP SYN
// without ACK, or anything not TCP: `CT_F_OPENED`, kept by the later
// packets): when the backend's entry of a kube-proxy-translated
// connection is evicted mid-way, its next segment would otherwise look
// like a new connection of its own, be delivered directly and reach the
// client from the backend's address; as it is, it crosses the host's
// stack, whose conntrack reverses the DNAT (`TestLocalDeliveryLostConntrack`).
// A UDP or ICMP reply whose entry was evicted cannot be told from a new
// flow and still goes directly. A directly delivered TCP segment without
// SYN skips to_container's L7-proxy socket lookup (`proxy_upstream`): the
// sender's conntrack held it as a connection one of the two pods began,
// which the proxy's upstream connections (from the node's stack, never
// marked) are not; as a conntrack reply already does, the entry takes
// precedence over a socket of the same tuple. Fragments, IPv6 packets with extension headers,
// packets too big for the veth and TTLs running out go through the stack
// (its reassembly must see all of a datagram; it answers with ICMP), as
// does anything bound for the L7 proxy or a Service hairpin.
//
// Kernel verdict = `policy.MapState.AllowsAddr`: identity entries (the
// lookup order of `policy.Lookups`) or CIDR entries (`CIDRAllows`: the
// longest match of the exact, port-wildcard and any-protocol groups),
// checked by randomized BPF_PROG_TEST_RUN tests.
//
// CIDR rules never widen an identity. An ipBlock or CIDR rule is decided
// on the packet's address in the endpoint's `cidr` map, so a pod's /32
// admits that pod only, never the siblings sharing its identity; pod
// identities are untouched by CIDR rules.
//
// Orphans need two passes. The garbage collector removes a veth, pin
// directory or endpoint only when two consecutive passes saw it orphaned
// (or missing): a CNI ADD creates its veth before its endpoint exists. It
// starts after restore.
package datapath
