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
 *                 made PACKET_HOST so the stack routes it.
 *
 * The host's own traffic (identity host on the sending node) is sent as
 * world: the receiving node must not take it for its own host.
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

#define IDENTITY_HOST 1
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

/* inner_addrs reads the inner IP header's family and addresses. */
static __always_inline int inner_addrs(struct __sk_buff *skb, __u8 *family, __u32 *saddr, __u32 *daddr)
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
		return 0;
	case ETH_P_IPV6:
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)))
			return -1;
		*family = 6;
		__builtin_memcpy(saddr, &ip6.saddr, 16);
		__builtin_memcpy(daddr, &ip6.daddr, 16);
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
	__u8 family = 0;

	if (inner_addrs(skb, &family, saddr, daddr))
		return TC_ACT_SHOT;
	node = remote_node(family, daddr);
	if (!node)
		return TC_ACT_SHOT;
	src = ipcache_lookup(family, saddr);
	if (src && src->identity != IDENTITY_HOST && src->identity <= MARK_IDENTITY_MAX)
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

SEC("tc")
int from_overlay(struct __sk_buff *skb)
{
	struct bpf_tunnel_key key = {};
	__u32 id;

	if (bpf_skb_get_tunnel_key(skb, &key, sizeof(key), 0) &&
	    bpf_skb_get_tunnel_key(skb, &key, sizeof(key), BPF_F_TUNINFO_IPV6))
		return TC_ACT_SHOT;
	id = key.tunnel_id & MARK_IDENTITY_MAX;
	if (id == 0)
		id = IDENTITY_WORLD;
	skb->mark = (id << 8) | MARK_IDENTITY_MAGIC;
	bpf_skb_change_type(skb, PACKET_HOST_);
	return TC_ACT_OK;
}
