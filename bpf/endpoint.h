/* Map layouts shared by the endpoint programs and user space (datapath/).
 * bpf2go generates the Go types from these structs (-type), so the Go
 * side never re-declares a layout by hand. */
#ifndef MEMBRANE_ENDPOINT_H
#define MEMBRANE_ENDPOINT_H

#include <linux/types.h>

/* Traffic direction relative to the endpoint (policy.Direction). */
#define DIR_INGRESS 0 /* to-container */
#define DIR_EGRESS 1  /* from-container */

/* Reserved identities (pkg/identity): 1 to 255 are reserved, cluster
 * identities start at IDENTITY_MIN_CLUSTER. */
#define IDENTITY_HOST 1
#define IDENTITY_WORLD 2
#define IDENTITY_HEALTH 4
#define IDENTITY_INIT 5
#define IDENTITY_REMOTE_NODE 6
#define IDENTITY_KUBE_APISERVER 7
#define IDENTITY_MIN_CLUSTER 256
/* Per-node identities (--enable-node-selector-labels,
 * identity.MinNodeIdentity): another node's addresses get one from this
 * range (Cilium's remote-node scope), labelled reserved:remote-node. */
#define IDENTITY_NODE_SCOPE 0x02000000
#define IDENTITY_SCOPE_MASK 0xff000000

/* is_remote_node reports whether id is another node's: remote-node,
 * kube-apiserver (which carries its label) or a per-node identity. */
static inline int is_remote_node(__u32 id)
{
	return id == IDENTITY_REMOTE_NODE || id == IDENTITY_KUBE_APISERVER ||
	       (id & IDENTITY_SCOPE_MASK) == IDENTITY_NODE_SCOPE;
}

/* POLICY_ENFORCE_IDENTITY marks the per-direction enforcement entry of a
 * policy map: {POLICY_ENFORCE_IDENTITY, 0, 0, dir} present means dir is
 * default-deny. Enforcement lives in the map, not in a program constant,
 * so that toggling it is a policy-only change (a map write) that never
 * reloads the program. User space refuses policy keys with this identity. */
#define POLICY_ENFORCE_IDENTITY 0xffffffff

/* Drop reasons (datapath.DropReason*). */
enum drop_reason {
	DROP_POLICY = 1,     /* no policy entry allows a new connection */
	DROP_FRAGMENT = 2,   /* non-first fragment with no L3/proto-wide entry */
	DROP_MALFORMED = 3,  /* truncated or unparseable IP header */
	/* A frame from the pod that is not an untagged IPv4, IPv6 or ARP
	 * frame (VLAN tags included); to the pod: neither IP nor ARP, in an
	 * enforced direction. */
	DROP_UNKNOWN_L3 = 4,
	/* 5 is DROP_NO_BACKEND (lb.h) */
	DROP_PROXY = 6, /* redirected to an L7 proxy port no socket listens on */
	/* The interface the program runs on has no endpoint_info entry (or
	 * its endpoint no policy maps): every frame is dropped, counted under
	 * endpoint 0. Fail closed: nothing says which policy applies. */
	DROP_NO_ENDPOINT = 7,
	/* A packet from the pod whose source is not one of the endpoint's
	 * addresses (Cilium's DROP_INVALID_SIP), or of a family the endpoint
	 * has no address of; an ARP frame whose sender is not its IPv4
	 * address. Essential ICMPv6 from fe80::/10 or :: passes. */
	DROP_INVALID_SOURCE = 8,
	/* A UDP datagram from the pod to the node's tunnel port
	 * (node_config.tunnel_port): a VXLAN header written by a pod would
	 * carry an identity of its choosing (Cilium's fix of CVE-2019-13119). */
	DROP_TUNNEL_PORT = 9,
	/* from_overlay (counted under endpoint 0, ingress): the outer source
	 * is no known node's address (tunnel_nodes). */
	DROP_UNKNOWN_NODE = 10,
	/* from_overlay: the inner source is neither in the sending node's pod
	 * CIDRs (tunnel) nor one of its addresses (tunnel_nodes). */
	DROP_TUNNEL_SOURCE = 11,
	/* from_overlay: the VNI is a reserved identity to_overlay never sends
	 * (overlay_identity_ok): host, unmanaged, 0, 6..255. */
	DROP_TUNNEL_IDENTITY = 12,
	/* A deny entry (ingressDeny/egressDeny) matches a new connection:
	 * the policy map's longest match has deny set, or a CIDR deny group
	 * holds the peer's address. */
	DROP_POLICY_DENY = 13,
	/* Not a drop: an endpoint in audit mode (ENDPOINT_F_AUDIT) sent or
	 * received a new connection that DROP_POLICY or DROP_POLICY_DENY
	 * would drop; it passes, counted and reported under this reason
	 * (the verdict audit). */
	DROP_POLICY_AUDIT = 14,
	/* 15 is unused; 16 and 17 are DROP_NO_ROUTE and DROP_NAT_EXHAUSTED
	 * (lb.h). In an enforced direction, a peer address in the node's
	 * or the cluster's pod CIDRs (node_config.pods) that the ipcache
	 * resolves to world or a CIDR identity: a pod whose ipcache entry
	 * is missing (the ipcache was full, --ipcache-max), whose identity
	 * no rule can be checked against (unknown_pod). */
	DROP_UNKNOWN_POD = 18,
};

/* endpoint_info is the value of the per-node endpoint_info map, keyed by
 * the ifindex of the endpoint's host veth in the node's netns. The
 * addresses made it 36 bytes, from 16: the agent carries the entries of
 * a map pinned with the old layout over to a new map
 * (datapath/bpf_maps_linux.go, openEndpointsMap). */
struct endpoint_info {
	__u32 id;       /* endpoint.ID: conntrack, drop counters, events */
	__u32 identity; /* the endpoint's security identity (drop events) */
	/* slot: the key of the endpoint's policy maps in policy_maps and
	 * cidr_maps. Not the endpoint ID: every user-space write to a map of
	 * maps waits for an RCU grace period (maybe_wait_bpf_programs), so
	 * the agent fills slots ahead of time, off the CNI ADD's path, and
	 * hands one to each new endpoint (datapath/bpf_slots_linux.go). */
	__u32 slot;
	__u32 flags; /* ENDPOINT_F_* */
	/* The endpoint's addresses (network byte order bytes), each valid
	 * with its flag: from_container drops what the pod sends from any
	 * other source (DROP_INVALID_SOURCE), all of a family without one. */
	__u32 ipv4;
	__u32 ipv6[4];
};

/* endpoint_info.flags */
#define ENDPOINT_F_IPV4 1 /* ipv4 holds the endpoint's IPv4 address */
#define ENDPOINT_F_IPV6 2 /* ipv6 holds the endpoint's IPv6 address */
/* The endpoint's policy audit mode: what its policy would drop (no
 * entry allows it, or a deny entry matches) passes and is reported as
 * DROP_POLICY_AUDIT. Fragments without an entry are still dropped. */
#define ENDPOINT_F_AUDIT 4
/* ENDPOINT_F_ENFORCE_KNOWN: the agent keeps ENDPOINT_F_ENFORCE_INGRESS
 * and _EGRESS so that a direction whose flag is clear has no enforce
 * entry ({POLICY_ENFORCE_IDENTITY, dir}) in the endpoint's policy map,
 * and the programs skip that lookup: it sets a direction's flag before
 * it writes the entry and clears it after it deleted it
 * (datapath/bpf_epinfo_linux.go). A set flag still looks the entry up.
 * Without KNOWN (an earlier build's entry, the host endpoint's) the
 * lookup alone decides. */
#define ENDPOINT_F_ENFORCE_KNOWN 8
#define ENDPOINT_F_ENFORCE_INGRESS 16
#define ENDPOINT_F_ENFORCE_EGRESS 32

/* ipcache_key is an LPM trie key: prefixlen counts the 32 bits of
 * family+pad before addr (so prefixlen = 32 + prefix bits). IPv4
 * addresses use addr[0] and leave the rest zero. */
struct ipcache_key {
	__u32 prefixlen;
	__u8 family; /* 4 or 6 */
	__u8 pad[3];
	__u32 addr[4]; /* network byte order bytes; u32 for aligned copies */
};

/* tunnel_endpoint is the node a destination is tunnelled to (tunnel
 * mode): family 0 is none. */
struct tunnel_endpoint {
	__u8 family; /* 0, 4 or 6 */
	__u8 pad[3];
	__u32 addr[4]; /* network byte order bytes */
};

struct ipcache_value {
	__u32 identity;
	/* tunnel is the node hosting a remote endpoint (index.IPCacheEntry.
	 * TunnelEndpoint); none for local and policy entries. */
	struct tunnel_endpoint tunnel;
};

/* node_config_value is the one value (key 0) of the node_config map: settings
 * of the node the datapath writes when they change. */
#define NODE_POD_CIDRS 4
/* How many uplinks node_config_value names (native routing's direct
 * delivery; the devices past the first NODE_UPLINKS go through the
 * stack). */
#define NODE_UPLINKS 4

/* pod_cidr is a pod CIDR of node_config_value: an address a is in it if
 * (a[i] ^ addr[i]) & mask[i] is 0 for each word (network byte order
 * bytes; IPv4 in word 0, the others' masks 0). family 0: unused. */
struct pod_cidr {
	__u32 addr[4];
	__u32 mask[4];
	__u8 family; /* 4, 6 */
	__u8 pad[3];
};

struct node_config_value {
	/* The tunnel device's UDP port in tunnel mode (host byte order), 0
	 * in native routing: from_container drops UDP to it
	 * (DROP_TUNNEL_PORT). */
	__u32 tunnel_port;
	/* The node's pod CIDRs, then the cluster's (the first
	 * NODE_POD_CIDRS of LinuxConfig.Nodes.LocalPodCIDRs and
	 * ClusterCIDRs): DROP_UNKNOWN_POD. */
	struct pod_cidr pods[NODE_POD_CIDRS];
	/* The tunnel device's ifindex once its overlay programs deliver
	 * straight to the endpoints (tunnel mode), else 0: from_container
	 * then sends a pod's packet for a remote pod straight to it
	 * (remote_deliver in endpoint.c, from_overlay's direct delivery in
	 * overlay.c). */
	__u32 tunnel_ifindex;
	/* Native routing: the uplinks (ifindexes; 0 unused) whose
	 * from_netdev delivers straight to the endpoints (netdev_deliver in
	 * endpoint.c): from_container then sends a pod's packet for a remote
	 * pod that the FIB routes out of one of them straight there. */
	__u32 uplinks[NODE_UPLINKS];
	/* NETDEV_F_*: what from_netdev does besides netdev_deliver. */
	__u32 netdev_flags;
};

/* netdev_flags: from_netdev only delivers (native routing without the
 * kube-proxy replacement or the host firewall, which attach it too):
 * no NodePort translation (nodeport.h), no host firewall (hostfw.h).
 * Without it (0, also before the agent writes node_config) it does both
 * first. */
#define NETDEV_F_DELIVER_ONLY 1

/* is_uplink reports whether ifindex is one of c's uplinks. */
static __always_inline int is_uplink(struct node_config_value *c, __u32 ifindex)
{
	int i;

#pragma unroll
	for (i = 0; i < NODE_UPLINKS; i++)
		if (c->uplinks[i] && c->uplinks[i] == ifindex)
			return 1;
	return 0;
}

/* in_pods reports whether the address a of family is in one of c's pod
 * CIDRs (the node's and the cluster's). */
static __always_inline int in_pods(struct node_config_value *c, __u8 family, __u32 *a)
{
	int i;

#pragma unroll
	for (i = 0; i < NODE_POD_CIDRS; i++) {
		struct pod_cidr *pc = &c->pods[i];

		if (pc->family != family)
			continue;
		if (!((a[0] ^ pc->addr[0]) & pc->mask[0]) && !((a[1] ^ pc->addr[1]) & pc->mask[1]) &&
		    !((a[2] ^ pc->addr[2]) & pc->mask[2]) && !((a[3] ^ pc->addr[3]) & pc->mask[3]))
			return 1;
	}
	return 0;
}

/* Policy CIDR identities (policy.MinCIDRIdentity) run from here to the
 * per-node ones (IDENTITY_NODE_SCOPE). */
#define IDENTITY_CIDR_MIN 0x01000000

/* overlay_identity_ok reports whether id may cross the overlay as a VNI:
 * world, health and init among the reserved identities, and every
 * cluster identity. to_overlay sends world instead of any other, and
 * from_overlay drops any other (DROP_TUNNEL_IDENTITY): above all host,
 * which would let the sender pose as the receiving node itself. */
static inline int overlay_identity_ok(__u32 id)
{
	return id == IDENTITY_WORLD || id == IDENTITY_HEALTH || id == IDENTITY_INIT || id >= IDENTITY_MIN_CLUSTER;
}

/* tunnel_value is a value of the tunnel map (overlay.c): a remote node's
 * pod CIDR (keyed like the ipcache) -> that node (the address to_overlay
 * sends to: its IPv4 one if it has one); and of the tunnel_nodes map:
 * each address of a remote node -> the same. */
struct tunnel_value {
	struct tunnel_endpoint node;
};

/* MARK_IDENTITY_MAGIC in the low byte of skb->mark says the upper 24
 * bits carry the source identity a tunnel delivered (overlay.c's
 * from_overlay sets it; the endpoint programs read it). */
#define MARK_IDENTITY_MAGIC 0x4d
#define MARK_IDENTITY_MAX 0xffffff
#define MARK_MAGIC_MASK 0xff

/* MARK_PROXY_MAGIC in the low byte says the packet comes from the L7
 * proxy (the SO_MARK of its upstream connections), on behalf of the
 * source identity in the upper 24 bits (0: unknown, the ipcache decides
 * on the source address). The endpoint programs take that identity as
 * the peer and never redirect such a packet again: the proxy checked
 * both sides' L7 rules. Pods cannot forge marks: crossing the veth out
 * of their netns clears skb->mark. */
#define MARK_PROXY_MAGIC 0x4e

/* MARK_TO_PROXY_MAGIC in the low byte, the proxy port in the upper 16
 * bits: a packet handed to the proxy's socket (bpf_sk_assign). The
 * datapath's ip rule (fwmark MARK_TO_PROXY_MAGIC/MARK_MAGIC_MASK ->
 * table PROXY_ROUTE_TABLE, "local default dev lo") makes the host
 * deliver it locally whatever its destination. to_container also sets
 * it on the packets it hairpins to from_container (see endpoint.c). */
#define MARK_TO_PROXY_MAGIC 0x4f

/* MARK_FROM_ENDPOINT_MAGIC in the low byte (upper bits 0): a packet
 * from_container let out of a pod (lb_out), whose verdict the pod's
 * egress policy made. The mark survives the host's forwarding and
 * nftables' masquerade; to_netdev (hostfw.h) leaves such a packet to that
 * verdict instead of the host's egress policy, which would otherwise
 * apply to pod traffic masqueraded to the node's address. Pods cannot
 * forge it (the veth clears skb->mark); host processes with
 * CAP_NET_ADMIN can (SO_MARK), as they can unload the programs. */
#define MARK_FROM_ENDPOINT_MAGIC 0x50

/* MARK_NODEPORT_MAGIC in the low byte (upper bits 0): from_netdev
 * translated the packet for a NodePort's local backend and redirected it
 * to the backend's host veth, whose to_container records its connection
 * as NodePort-translated (ct_value.flags CT_F_NODEPORT). The redirect
 * stays in the node's netns, so the mark survives; the pod's netns never
 * sees it. */
#define MARK_NODEPORT_MAGIC 0x51

/* MARK_DIRECT_MAGIC in the low byte (upper bits 0): from_container
 * delivered the packet straight to a local endpoint's host veth
 * (local_deliver in endpoint.c: bpf_redirect to its egress, past the
 * host's stack), whose to_container records the connection as
 * delivered so (ct_value.flags CT_F_DIRECT): only then do its replies
 * go back the same way. A packet the host's stack forwarded never
 * carries it (the redirect is the mark's last writer before
 * to_container); the pod's netns never sees it (the veth clears marks). */
#define MARK_DIRECT_MAGIC 0x52

/* MARK_IDENTITY_DIRECT_MAGIC in the low byte: MARK_IDENTITY_MAGIC's
 * (the tunnel's source identity in the upper 24 bits) for a packet
 * from_overlay delivered straight to a local endpoint's host veth past
 * the host's stack, like MARK_DIRECT_MAGIC: its to_container records the
 * connection as delivered so (CT_F_DIRECT). */
#define MARK_IDENTITY_DIRECT_MAGIC 0x53

/* MARK_UPLINK_DIRECT_MAGIC in the low byte (upper bits 0): like
 * MARK_DIRECT_MAGIC for a packet from_netdev delivered straight from a
 * native-routing uplink (netdev_deliver, after its reverse-path check):
 * its to_container records the connection with CT_F_DIRECT and
 * CT_F_UPLINK. */
#define MARK_UPLINK_DIRECT_MAGIC 0x54

/* policy_key is an LPM trie key over {identity, dir, proto, dport}: an
 * entry's prefixlen says which fields it matches. Wildcards are shorter
 * prefixes (and zero fields): L3-only (identity and dir) is
 * POLICY_PREFIX_L3, port wildcard (plus proto) POLICY_PREFIX_PROTO, exact
 * (plus dport) POLICY_PREFIX_FULL. Identity 0 (any peer) is an exact
 * value looked up second. No field is ever matched in part, so identity
 * and dport are in host byte order. */
struct policy_key {
	__u32 prefixlen;
	__u32 identity;
	__u8 dir;
	__u8 proto;
	__u16 dport;
};

#define POLICY_PREFIX_L3 40
#define POLICY_PREFIX_PROTO 48
#define POLICY_PREFIX_FULL 64

/* policy_value counts what each entry matched (atomic adds) and says
 * where allowed traffic goes: proxy_port 0 is straight on, otherwise the
 * L7 proxy listening on that port of the node (policy.Redirect). deny 1
 * drops what the entry matches (policy.MapState.Deny: user space turns
 * every allow a deny covers into a deny and adds the intersection of
 * each deny with every broader allow, so the longest match of a
 * connection some deny matches is always a deny). */
struct policy_value {
	__u64 packets;
	__u64 bytes;
	__u16 proxy_port; /* host byte order */
	__u8 deny;
	__u8 pad1;
	__u16 pad[2];
};

/* cidr_key is an LPM trie key of an endpoint's CIDR policy map: {dir,
 * proto, dport, family} are always matched whole (prefixlen counts their
 * 64 bits), then prefixlen - 64 bits of the peer's address. Entries of one
 * {dir, proto, dport} group form a trie of their own: a lookup returns the
 * longest prefix of that group holding the address, whose value says
 * allow or deny (an except carved out of a broader prefix). Port and
 * protocol wildcards are groups with dport 0 and proto 0, looked up in
 * turn; the packet passes if one group's longest match allows it. */
struct cidr_key {
	__u32 prefixlen;
	__u8 dir;
	__u8 proto;
	__u16 dport; /* host byte order, matched whole */
	__u8 family; /* 4 or 6 */
	__u8 pad[3];
	__u32 addr[4]; /* network byte order bytes */
};

#define CIDR_PREFIX_BASE 64

/* CIDR_DIR_DENY in cidr_key.dir marks the groups of deny entries: a
 * new connection whose peer address one of them holds (longest match
 * with allow 1) is dropped, whatever else allows it (cidr_match). */
#define CIDR_DIR_DENY 2

/* cidr_value: allow is 1 or 0 (deny: the longest match is an except);
 * the counters count what an allow entry allowed (atomic adds). */
struct cidr_value {
	__u64 packets;
	__u64 bytes;
	__u32 allow;
	__u32 pad;
};

/* ct_key: the connection as first seen by endpoint ep in direction dir
 * (saddr/sport are the initiator's). A reply is looked up with the
 * reversed tuple and the other direction. */
struct ct_key {
	__u16 ep;
	__u8 dir;
	__u8 family;
	__u8 proto;
	__u8 pad;
	__u16 sport; /* network byte order */
	__u16 dport; /* network byte order */
	__u16 pad2;
	__u32 saddr[4]; /* network byte order bytes */
	__u32 daddr[4];
};

/* ct_value.flags: whether the connection's replies are reverse-
 * translated (Cilium keeps a rev-NAT index in its CT entry for this).
 * ct_record writes them from each packet of the original direction, so
 * they follow the connection last opened with the tuple: a Service
 * connection, then a direct one from the same client address and port
 * to the same backend (the backend sees the same tuple) leaves only the
 * second's. The frontend itself is in lb_revnat (lb.h), keyed by the
 * reply's tuple; the flags say whether to use it:
 *   CT_F_KNOWN    written by this build; an entry without it was written
 *                 by an earlier one (before an upgrade, until the next
 *                 packet of its original direction), whose replies are
 *                 looked up in lb_revnat alone, as that build did
 *   CT_F_SVC      the pod's packets are Service-translated
 *                 (lb_translate): replies get the frontend back at the
 *                 pod's to-container
 *   CT_F_NODEPORT the packets to the pod arrive NodePort-translated from
 *                 outside (from_netdev, MARK_NODEPORT_MAGIC): replies go
 *                 to nodeport_reply from its from-container
 *   CT_F_DIRECT   the packets to the pod arrive delivered straight from
 *                 a local pod's from_container (MARK_DIRECT_MAGIC), past
 *                 the host's stack: the replies may go back the same way
 *                 (local_deliver). Without it they cross the host's stack
 *                 as the requests did, whose netfilter may have
 *                 translated the requests (kube-proxy) and must see the
 *                 replies to reverse it.
 *   CT_F_OPENED   (the pod's own connections, from_container) the entry
 *                 was created by a packet that begins a connection: a TCP
 *                 SYN without ACK, or anything not TCP. Kept by later
 *                 packets. Only then are the connection's packets of the
 *                 original direction delivered directly (local_deliver):
 *                 a TCP packet of a connection the pod's conntrack lost
 *                 (evicted; an entry from before an upgrade) may be the
 *                 reply of a request netfilter translated (kube-proxy's
 *                 DNAT), which only the host's stack reverses.
 * The earlier layout's packets was a __u64: on little-endian machines its
 * low half is today's packets and the high half (zero) today's flags, so
 * the pinned map is carried over as it is and its entries read as an
 * earlier build's. */
#define CT_F_KNOWN 1
#define CT_F_SVC 2
#define CT_F_NODEPORT 4
#define CT_F_DIRECT 8
#define CT_F_OPENED 16
/*   CT_F_UPLINK   native routing: the connection's packets cross an
 *                 uplink straight, and its address on the far side was
 *                 found routed through an uplink: on the endpoint's
 *                 ingress entry, netdev_deliver checked the reverse path
 *                 of the packets it delivered (MARK_UPLINK_DIRECT_MAGIC);
 *                 on its egress entry (kept, as CT_F_OPENED), the FIB
 *                 sent the pod's first packet straight out of an uplink
 *                 (local_deliver). netdev_deliver skips the reverse-path
 *                 lookup for later packets of such a connection. */
#define CT_F_UPLINK 32

/* Connection lifetimes without traffic. */
#define CT_LIFETIME_TCP (6ULL * 3600 * 1000000000ULL)
#define CT_LIFETIME_OTHER (60ULL * 1000000000ULL)

struct ct_value {
	__u64 last_seen; /* bpf_ktime_get_ns */
	__u32 packets;   /* wraps */
	__u32 flags;     /* CT_F_* */
};

/* host_safe_key: a peer of the host firewall's safety net (hostfw.h):
 * the address and TCP port (network byte order; 0: any) of the API
 * server the agent uses, of etcd in kvstore mode. */
struct host_safe_key {
	__u8 family; /* 4 or 6 */
	__u8 proto;
	__u16 port;    /* network byte order; 0: any port */
	__u32 addr[4]; /* network byte order bytes */
};

struct drop_key {
	__u16 ep;
	__u8 reason;
	__u8 dir;
};

struct drop_value {
	__u64 packets;
	__u64 bytes;
};

/* drop_event is one ring-buffer drop notification. */
struct drop_event {
	__u64 time_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u16 ep;
	__u8 reason;
	__u8 dir;
	__u8 family; /* 0 for non-IP */
	__u8 proto;
	__u16 sport; /* host byte order */
	__u16 dport; /* host byte order */
	__u8 tcp_flags; /* TCP (not a later fragment): the header's flags byte; else 0 */
	__u8 pad;
	__u32 peer_identity;
	__u32 identity; /* the endpoint's own */
	__u32 len;
	__u32 saddr[4]; /* network byte order bytes */
	__u32 daddr[4];
};

/* Flow verdicts (flow_event.verdict; datapath.FlowVerdict*). Drops are
 * reported as drop_events, not flows: the agent turns both into flows. */
#define FLOW_FORWARDED 1  /* passed to its destination */
#define FLOW_REDIRECTED 2 /* handed to the L7 or DNS proxy (proxy_port) */

/* flow_event.flags */
#define FLOW_F_TRANSLATED 1 /* a Service translated it: svc_addr/svc_port hold the frontend */
#define FLOW_F_ENFORCED 2   /* the direction is policy-enforced: an entry allowed it */
#define FLOW_F_HAIRPIN 4    /* a Service hairpin (the backend is the client itself) */

/* flow_event is one ring-buffer flow report (the flows map): the first
 * packet of a connection, when conntrack creates its entry (ct_record),
 * with the verdict it got. Per connection, not per packet: the replies
 * and later packets report nothing; drops are drop_events. */
struct flow_event {
	__u64 time_ns; /* bpf_ktime_get_ns (CLOCK_MONOTONIC) */
	__u16 ep;
	__u8 dir;
	__u8 family;
	__u8 proto;
	__u8 verdict;   /* FLOW_* */
	__u8 tcp_flags; /* the TCP header's flags byte (FIN 1, SYN 2, RST 4, PSH 8, ACK 16, ...) */
	__u8 flags;     /* FLOW_F_* */
	__u16 sport;    /* host byte order; after Service translation */
	__u16 dport;
	__u16 svc_port;   /* host byte order: the frontend's port (FLOW_F_TRANSLATED) */
	__u16 proxy_port; /* host byte order (FLOW_REDIRECTED) */
	__u32 peer_identity;
	__u32 identity; /* the endpoint's own */
	__u32 len;
	__u32 pad;
	__u32 saddr[4]; /* network byte order bytes */
	__u32 daddr[4];
	__u32 svc_addr[4]; /* the frontend's address (FLOW_F_TRANSLATED) */
};

/* flow_config_value is the one value (key 0) of the flow_config map,
 * written by the agent (--flows): the programs read it for each new
 * connection, so turning flows on or off reloads nothing. */
struct flow_config_value {
	__u32 flags; /* FLOW_CONFIG_* */
};

#define FLOW_CONFIG_ON 1 /* report flows */

/* flow_stats_value: per-CPU counters (flow_stats, key 0) the agent sums
 * and shows: flows reported, flows and drop notifications lost because
 * their ring buffer was full. */
struct flow_stats_value {
	__u64 flows;
	__u64 flows_lost;
	__u64 drops_lost;
};

#endif
