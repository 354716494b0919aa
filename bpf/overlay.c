//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Membrane's overlay programs (tunnel routing mode), loaded once per node
 * on the tunnel device, a VXLAN device in external (collect_md) mode:
 *
 *   to_overlay    TCX egress of the tunnel device: picks the remote node
 *                 for the inner destination (the ipcache entry's tunnel
 *                 endpoint, else the tunnel map: remote pod CIDR -> node)
 *                 and sets the tunnel key: that node as the outer
 *                 destination, the inner source's identity (ipcache) as
 *                 the VNI. No node known: dropped (TC_ACT_SHOT).
 *   from_overlay  TCX ingress of the tunnel device: the VNI is the
 *                 sender's identity for the inner source; it goes to the
 *                 endpoint programs in skb->mark (MARK_IDENTITY_MAGIC),
 *                 so the receiving node's policy does not trust the
 *                 inner source address. The frame's destination MAC is
 *                 the sending device's own (NOARP device): the packet is
 *                 made PACKET_HOST so the stack routes it, unless it
 *                 goes straight to a local endpoint's host veth
 *                 (overlay_deliver: the pod-to-pod connections whose
 *                 other direction skips the stack too).
 *
 * The host's own traffic (identity host on the sending node) is sent as
 * world: the receiving node must not take it for its own host. So is
 * every reserved identity but health and init (overlay_identity_ok).
 * from_overlay gives world from one of the sending node's own addresses
 * (its host's traffic, checked against tunnel_nodes) the identity this
 * node's ipcache gives that address when it is a node's (kube-apiserver
 * for an API server's node), else remote-node: what native routing
 * gets from the ipcache, and what `fromEntities: [remote-node]` needs.
 *
 * Trust: the VNI is believed only from a known node, for its own pods.
 * from_overlay accepts a packet when
 *   1. the outer source (the tunnel key's remote address) is an address
 *      of a known node (tunnel_nodes: every address of every remote node
 *      -> the node's tunnel address), else DROP_UNKNOWN_NODE;
 *   2. the VNI is an identity to_overlay sends (overlay_identity_ok),
 *      else DROP_TUNNEL_IDENTITY: host above all, which would pose as
 *      the receiving node itself;
 *   3. the inner source belongs to that node, by the data to_overlay
 *      sends by: its ipcache entry's tunnel endpoint is that node (a
 *      remote endpoint the agent placed there), or it is in one of the
 *      node's pod CIDRs (the tunnel map's entry names the same node), or
 *      it is one of the node's addresses (its host's own traffic, sent
 *      as world); else DROP_TUNNEL_SOURCE.
 * Non-IP inner frames are dropped (DROP_UNKNOWN_L3). Drops count under
 * endpoint 0, direction ingress, in the endpoint programs' shared drops
 * map, with a drop event. Pods cannot write VXLAN themselves: the
 * endpoint program drops their UDP to the tunnel port (DROP_TUNNEL_PORT).
 * What this cannot stop: a host on the underlay sending VXLAN from a
 * node's address (spoofed or on the same segment) passes all three
 * checks; only authenticated encryption between nodes would (Cilium:
 * IPsec or WireGuard).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "endpoint.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define OVERLAY_TTL 64
#define PACKET_HOST_ 0

/* The node's ipcache (pinned at <bpffs>/ipcache, shared with the
 * endpoint programs). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ipcache SEC(".maps");

/* Pinned at <bpffs>/tunnel: remote pod CIDR -> node (datapath.SyncNodes). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct tunnel_value);
	__uint(max_entries, 16 * 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} tunnel SEC(".maps");

/* Pinned at <bpffs>/tunnel_nodes: each address of each remote node ->
 * that node's entry in the tunnel map (datapath.SyncNodes). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct tunnel_endpoint);
	__type(value, struct tunnel_value);
	__uint(max_entries, 16 * 1024);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} tunnel_nodes SEC(".maps");

/* The endpoint programs' drop counters and events (<bpffs>/drops and
 * <bpffs>/events; the loader replaces these with the pinned maps, so the
 * definitions must stay identical to endpoint.c's). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct drop_key);
	__type(value, struct drop_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* The endpoint programs' endpoints, conntrack and node settings
 * (<bpffs>/endpoints_by_ifindex, <bpffs>/ct, <bpffs>/node_config;
 * replaced with the pinned maps, so the definitions must stay identical
 * to endpoint.c's): from_overlay's direct delivery (overlay_deliver). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 65536);
} ct SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct node_config_value);
	__uint(max_entries, 1);
} node_config SEC(".maps");

#define ETH_HLEN_ 14
#define AF_INET_ 2
#define AF_INET6_ 10

#include "forward.h"

/* inner_l3 is what inner_addrs read of the inner IP header for
 * inner_l4, which does not load it again. */
struct inner_l3 {
	__u32 l4off; /* the transport header's offset */
	__u8 proto;  /* IPv4's protocol, IPv6's next header */
	__u8 l4ok;   /* IPv4: a header length of at least 5 and no fragment; IPv6: always */
};

/* inner_addrs reads the inner IP header's family and addresses, and
 * into l3 what inner_l4 needs of it. */
static __always_inline int inner_addrs(struct __sk_buff *skb, __u8 *family, __u32 *saddr, __u32 *daddr,
				       struct inner_l3 *l3)
{
	struct iphdr ip;
	struct ipv6hdr ip6;

	switch (bpf_ntohs(skb->protocol)) {
	case ETH_P_IP:
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)))
			return -1;
		*family = 4;
		saddr[0] = ip.saddr;
		daddr[0] = ip.daddr;
		l3->proto = ip.protocol;
		l3->l4ok = ip.ihl >= 5 && !(ip.frag_off & bpf_htons(0x3fff));
		l3->l4off = ETH_HLEN + ip.ihl * 4;
		return 0;
	case ETH_P_IPV6:
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
			return -1;
		*family = 6;
		__builtin_memcpy(saddr, &ip6.saddr, 16);
		__builtin_memcpy(daddr, &ip6.daddr, 16);
		l3->proto = ip6.nexthdr;
		l3->l4ok = 1;
		l3->l4off = ETH_HLEN + sizeof(ip6);
		return 0;
	}
	return -1;
}

static __always_inline struct ipcache_value *ipcache_lookup(__u8 family, __u32 *addr)
{
	struct ipcache_key k = { .family = family };

	k.prefixlen = 32 + (family == 4 ? 32 : 128);
	__builtin_memcpy(k.addr, addr, 16);
	return bpf_map_lookup_elem(&ipcache, &k);
}

/* remote_node is the tunnel endpoint for daddr: the ipcache entry's, else
 * the tunnel map's (the remote node's pod CIDR). */
static __always_inline struct tunnel_endpoint *remote_node(__u8 family, __u32 *daddr)
{
	struct ipcache_key k = { .family = family };
	struct ipcache_value *v;
	struct tunnel_value *t;

	v = ipcache_lookup(family, daddr);
	if (v && v->tunnel.family)
		return &v->tunnel;
	k.prefixlen = 32 + (family == 4 ? 32 : 128);
	__builtin_memcpy(k.addr, daddr, 16);
	t = bpf_map_lookup_elem(&tunnel, &k);
	return t ? &t->node : NULL;
}

SEC("tc")
int to_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = { .tunnel_ttl = OVERLAY_TTL };
	__u32 saddr[4] = {}, daddr[4] = {};
	struct tunnel_endpoint *node;
	struct ipcache_value *src;
	__u32 id = IDENTITY_WORLD, flags = 0;
	struct inner_l3 l3 = {};
	__u8 family = 0;

	if (inner_addrs(skb, &family, saddr, daddr, &l3))
		return TC_ACT_SHOT;
	node = remote_node(family, daddr);
	if (!node)
		return TC_ACT_SHOT;
	src = ipcache_lookup(family, saddr);
	if (src && src->identity <= MARK_IDENTITY_MAX && overlay_identity_ok(src->identity))
		id = src->identity;
	key.tunnel_id = id;
	if (node->family == 4) {
		key.remote_ipv4 = bpf_ntohl(node->addr[0]);
	} else {
		__builtin_memcpy(key.remote_ipv6, node->addr, 16);
		flags = BPF_F_TUNINFO_IPV6;
	}
	if (bpf_skb_set_tunnel_key(skb, &key, sizeof(key), flags))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

/* overlay_drop counts a packet from_overlay drops under endpoint 0,
 * ingress, and reports it (peer: the VNI). */
static __always_inline int overlay_drop(struct __sk_buff *skb, __u8 reason, __u8 family, __u32 *saddr, __u32 *daddr,
					__u32 peer)
{
	struct drop_key k = { .ep = 0, .reason = reason, .dir = DIR_INGRESS };
	struct drop_value zero = {}, *v;
	struct drop_event *e;

	v = bpf_map_lookup_elem(&drops, &k);
	if (!v) {
		bpf_map_update_elem(&drops, &k, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&drops, &k);
	}
	if (v) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, skb->len);
	}
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return TC_ACT_SHOT;
	__builtin_memset(e, 0, sizeof(*e));
	e->time_ns = bpf_ktime_get_ns();
	e->reason = reason;
	e->dir = DIR_INGRESS;
	e->family = family;
	e->peer_identity = peer;
	e->len = skb->len;
	__builtin_memcpy(e->saddr, saddr, 16);
	__builtin_memcpy(e->daddr, daddr, 16);
	bpf_ringbuf_submit(e, 0);
	return TC_ACT_SHOT;
}

/* outer_source reads the tunnel key and its remote (the outer source)
 * address as a tunnel_endpoint. */
static __always_inline int outer_source(struct __sk_buff *skb, struct bpf_tunnel_key *key, struct tunnel_endpoint *src)
{
	if (!bpf_skb_get_tunnel_key(skb, key, sizeof(*key), 0)) {
		src->family = 4;
		src->addr[0] = bpf_htonl(key->remote_ipv4);
		return 0;
	}
	if (bpf_skb_get_tunnel_key(skb, key, sizeof(*key), BPF_F_TUNINFO_IPV6))
		return -1;
	src->family = 6;
	__builtin_memcpy(src->addr, key->remote_ipv6, 16);
	return 0;
}

static __always_inline int same_node(struct tunnel_endpoint *a, struct tunnel_endpoint *b)
{
	return a->family == b->family && a->addr[0] == b->addr[0] && a->addr[1] == b->addr[1] &&
	       a->addr[2] == b->addr[2] && a->addr[3] == b->addr[3];
}

/* inner_source_ok reports whether saddr belongs to node (the tunnel
 * address of the node the packet came from; outer: the address it came
 * from), on the data to_overlay sends by: the ipcache entry's tunnel
 * endpoint (the node hosting a remote endpoint) is that node, or saddr
 * is in one of its pod CIDRs (tunnel map), or saddr is one of its own
 * addresses (tunnel_nodes: its host's traffic). */
/* node_addr_identity: world from saddr, one of the sending node's own
 * addresses (tunnel_nodes: saddr -> node), is that node's host: the
 * identity the ipcache gives the address when it is a node's
 * (remote-node, or kube-apiserver where the API server runs there; 0 for
 * a per-node identity: the endpoint's ipcache lookup decides), else
 * remote-node. Anything else keeps id. */
static __always_inline __u32 node_addr_identity(struct tunnel_endpoint *node, __u8 family, __u32 *saddr, __u32 id)
{
	struct tunnel_endpoint a = { .family = family };
	struct ipcache_value *v;
	struct tunnel_value *t;

	if (id != IDENTITY_WORLD)
		return id;
	__builtin_memcpy(a.addr, saddr, 16);
	t = bpf_map_lookup_elem(&tunnel_nodes, &a);
	if (!t || !same_node(&t->node, node))
		return id;
	v = ipcache_lookup(family, saddr);
	if (v && (v->identity & IDENTITY_SCOPE_MASK) == IDENTITY_NODE_SCOPE)
		/* A per-node identity does not fit the mark's 24 bits: 0
		 * leaves it to the endpoint's ipcache lookup of saddr. */
		return 0;
	if (v && (v->identity == IDENTITY_REMOTE_NODE || v->identity == IDENTITY_KUBE_APISERVER))
		return v->identity;
	return IDENTITY_REMOTE_NODE;
}

static __always_inline int inner_source_ok(struct tunnel_endpoint *node, struct tunnel_endpoint *outer, __u8 family,
					   __u32 *saddr)
{
	struct ipcache_key k = { .family = family };
	struct tunnel_endpoint a = { .family = family };
	struct ipcache_value *v;
	struct tunnel_value *t;

	v = ipcache_lookup(family, saddr);
	if (v && v->tunnel.family) {
		if (same_node(&v->tunnel, outer))
			return 1;
		t = bpf_map_lookup_elem(&tunnel_nodes, &v->tunnel);
		if (t && same_node(&t->node, node))
			return 1;
	}
	k.prefixlen = 32 + (family == 4 ? 32 : 128);
	__builtin_memcpy(k.addr, saddr, 16);
	t = bpf_map_lookup_elem(&tunnel, &k);
	if (t && same_node(&t->node, node))
		return 1;
	__builtin_memcpy(a.addr, saddr, 16);
	t = bpf_map_lookup_elem(&tunnel_nodes, &a);
	return t && same_node(&t->node, node);
}

/* inner_l4 reads the inner packet's protocol (l3, inner_addrs'), ports
 * and TCP flags: TCP and UDP only, IPv4 without fragmentation, IPv6
 * without extension headers; -1 for anything else. */
static __always_inline int inner_l4(struct __sk_buff *skb, struct inner_l3 *l3, __u8 *proto, __u16 *ports, __u8 *flags)
{
	__u32 off = l3->l4off;

	if (!l3->l4ok)
		return -1;
	*proto = l3->proto;
	if (*proto == IPPROTO_TCP) {
		/* The ports and the flags in one load. */
		__u8 hdr[14];

		if (bpf_skb_load_bytes(skb, off, hdr, sizeof(hdr)))
			return -1;
		__builtin_memcpy(ports, hdr, 4);
		*flags = hdr[13];
		return 0;
	}
	if (*proto != IPPROTO_UDP)
		return -1;
	*flags = 0;
	return bpf_skb_load_bytes(skb, off, ports, 4) ? -1 : 0;
}

/* overlay_deliver sends an accepted packet (mark: its identity, already
 * set) straight to the host veth of the local endpoint the FIB routes
 * it to, past the host's stack (routing, netfilter, the neighbour
 * output), as from_container's local_deliver does on one node; the
 * endpoint's to_container gives its verdict there as before, and the
 * mark MARK_IDENTITY_DIRECT_MAGIC makes it record the connection as
 * delivered so (CT_F_DIRECT). Only where the other direction of the
 * connection leaves this node the same way (from_container's
 * remote_direct), so that netfilter sees both directions or neither:
 * node_config.tunnel_ifindex names this device, the inner source is in
 * a pod CIDR of the node or the cluster (node_config.pods), and the
 * connection is one whose other direction goes straight too
 * (forward.h's fwd_direct_conn: a reply of the endpoint's own
 * connection, a TCP SYN, a later packet of a connection that began so).
 * Anything else goes up the stack (TC_ACT_OK): replies of connections
 * the host's netfilter translated (kube-proxy's DNAT of a ClusterIP),
 * UDP and other protocols of connections the remote side began,
 * fragments, IPv6 extension headers, TTLs running out, packets too big
 * for the veth, and destinations that are no local endpoint. */
static __always_inline int overlay_deliver(struct __sk_buff *skb, __u8 family, __u32 *saddr, __u32 *daddr,
					   struct inner_l3 *l3, __u32 mark)
{
	struct bpf_fib_lookup fib = {};
	struct node_config_value *c;
	struct endpoint_info *ep;
	__u32 zero = 0, ifindex;
	__u16 ports[2];
	__u8 proto, flags;
	long r;

	c = bpf_map_lookup_elem(&node_config, &zero);
	if (!c || !c->tunnel_ifindex || c->tunnel_ifindex != skb->ifindex || !in_pods(c, family, saddr))
		return TC_ACT_OK;
	if (inner_l4(skb, l3, &proto, ports, &flags))
		return TC_ACT_OK;
	fib.l4_protocol = proto;
	fib.sport = ports[0];
	fib.dport = ports[1];
	fib.ifindex = skb->ifindex;
	if (family == 4) {
		fib.family = AF_INET_;
		fib.ipv4_src = saddr[0];
		fib.ipv4_dst = daddr[0];
	} else {
		fib.family = AF_INET6_;
		__builtin_memcpy(fib.ipv6_src, saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, daddr, 16);
	}
	r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r != BPF_FIB_LKUP_RET_SUCCESS && r != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	ifindex = fib.ifindex;
	ep = bpf_map_lookup_elem(&endpoints, &ifindex);
	if (!ep)
		return TC_ACT_OK;
	if (!fwd_direct_conn(ep->id, family, saddr, daddr, proto, ports[0], ports[1], flags))
		return TC_ACT_OK;
	return fwd_redirect(skb, &fib, r, family, mark);
}

SEC("tc")
int from_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	struct tunnel_endpoint outer = {};
	__u32 saddr[4] = {}, daddr[4] = {};
	struct tunnel_value *node;
	struct inner_l3 l3 = {};
	__u8 family = 0;
	__u32 id;

	if (outer_source(skb, &key, &outer))
		return TC_ACT_SHOT; /* no tunnel metadata: not from the VXLAN socket */
	id = key.tunnel_id & MARK_IDENTITY_MAX;
	if (inner_addrs(skb, &family, saddr, daddr, &l3))
		return overlay_drop(skb, DROP_UNKNOWN_L3, 0, saddr, daddr, id);
	node = bpf_map_lookup_elem(&tunnel_nodes, &outer);
	if (!node)
		return overlay_drop(skb, DROP_UNKNOWN_NODE, family, saddr, daddr, id);
	if (!overlay_identity_ok(id))
		return overlay_drop(skb, DROP_TUNNEL_IDENTITY, family, saddr, daddr, id);
	if (!inner_source_ok(&node->node, &outer, family, saddr))
		return overlay_drop(skb, DROP_TUNNEL_SOURCE, family, saddr, daddr, id);
	id = node_addr_identity(&node->node, family, saddr, id);
	skb->mark = (id << 8) | MARK_IDENTITY_MAGIC;
	bpf_skb_change_type(skb, PACKET_HOST_);
	return overlay_deliver(skb, family, saddr, daddr, &l3, (id << 8) | MARK_IDENTITY_DIRECT_MAGIC);
}
