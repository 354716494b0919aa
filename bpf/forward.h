/* Forwarding past the host's stack, shared by the endpoint programs
 * (endpoint.c: local_deliver, netdev_deliver; nodeport.h) and the overlay
 * programs (overlay.c: overlay_deliver): the TTL decrement the host's
 * forwarding would do, the redirect to the device the FIB named, and the
 * conntrack rule that lets a packet arriving from another node (the
 * tunnel device, a native-routing uplink) go straight to a local
 * endpoint's host veth.
 *
 * The including object declares the maps ct (conntrack, endpoint.c's
 * layout) and defines ETH_HLEN_, AF_INET_ and AF_INET6_ before it
 * includes this header.
 */
#ifndef MEMBRANE_FORWARD_H
#define MEMBRANE_FORWARD_H

#define FWD_TCP_SYN 0x02
#define FWD_TCP_ACK 0x10
/* What fwd_redirect rewrites: the Ethernet header and the IP header up
 * to IPv4's checksum, IPv6's hop limit. */
#define FWD_HDR4 (ETH_HLEN_ + 12)
#define FWD_HDR6 (ETH_HLEN_ + 8)

/* fwd_ttl_dec decrements the TTL (hop limit) of a packet of family (4,
 * 6) the node forwards past the stack, as the stack's forwarding would.
 * Returns -1 when it runs out: the callers leave such a packet to the
 * stack (which answers with ICMP) or drop it. */
static __always_inline int fwd_ttl_dec(struct __sk_buff *skb, __u8 family)
{
	__u16 oldw, neww;
	__u8 ttl;

	if (family == 6) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN_ + 7, &ttl, 1) || ttl <= 1)
			return -1;
		ttl--;
		return bpf_skb_store_bytes(skb, ETH_HLEN_ + 7, &ttl, 1, 0) ? -1 : 0;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN_ + 8, &oldw, 2))
		return -1;
	ttl = ((__u8 *)&oldw)[0];
	if (ttl <= 1)
		return -1;
	neww = oldw;
	((__u8 *)&neww)[0] = ttl - 1;
	if (bpf_l3_csum_replace(skb, ETH_HLEN_ + 10, oldw, neww, 2))
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN_ + 8, &neww, 2, 0) ? -1 : 0;
}

/* fwd_redirect sends a packet of family out of the device the FIB named
 * (r: bpf_fib_lookup's answer, BPF_FIB_LKUP_RET_SUCCESS or _NO_NEIGH;
 * fib: its result), with its TTL decremented and, unless mark is 0,
 * skb->mark set to mark. On success the FIB gave the MAC addresses; with
 * no resolved neighbour yet the kernel resolves the next hop (the
 * gateway the FIB put in fib's destination, else the destination
 * itself), after a check of the device's MTU (the FIB checked it only
 * on success). TC_ACT_OK (the stack's) when the MTU check fails or the
 * TTL runs out. */
static __always_inline int fwd_redirect(struct __sk_buff *skb, struct bpf_fib_lookup *fib, long r, __u8 family,
					__u32 mark)
{
	if (r == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = {};
		__u32 mtu = 0;

		if (bpf_check_mtu(skb, fib->ifindex, &mtu, 0, 0) || fwd_ttl_dec(skb, family))
			return TC_ACT_OK;
		if (family == 4) {
			nh.nh_family = AF_INET_;
			nh.ipv4_nh = fib->ipv4_dst;
		} else {
			nh.nh_family = AF_INET6_;
			__builtin_memcpy(nh.ipv6_nh, fib->ipv6_dst, 16);
		}
		if (mark)
			skb->mark = mark;
		return bpf_redirect_neigh(fib->ifindex, &nh, sizeof(nh), 0);
	}
	/* The MAC addresses and the TTL (with IPv4's header checksum) in
	 * one load and one store: two helper calls a packet. */
	if (family == 4) {
		__u8 h[FWD_HDR4];
		__u32 check;

		if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)) || h[ETH_HLEN_ + 8] <= 1)
			return TC_ACT_OK;
		h[ETH_HLEN_ + 8]--;
		/* RFC 1141, as the kernel's ip_decrease_ttl: the TTL is the
		 * high byte of its 16-bit word. */
		check = ((__u32)h[ETH_HLEN_ + 10] << 8 | h[ETH_HLEN_ + 11]) + 0x0100;
		check += check >= 0xffff;
		h[ETH_HLEN_ + 10] = check >> 8;
		h[ETH_HLEN_ + 11] = check;
		__builtin_memcpy(h, fib->dmac, 6);
		__builtin_memcpy(h + 6, fib->smac, 6);
		if (bpf_skb_store_bytes(skb, 0, h, sizeof(h), 0))
			return TC_ACT_SHOT;
	} else {
		__u8 h[FWD_HDR6];

		if (bpf_skb_load_bytes(skb, 0, h, sizeof(h)) || h[ETH_HLEN_ + 7] <= 1)
			return TC_ACT_OK;
		h[ETH_HLEN_ + 7]--;
		__builtin_memcpy(h, fib->dmac, 6);
		__builtin_memcpy(h + 6, fib->smac, 6);
		if (bpf_skb_store_bytes(skb, 0, h, sizeof(h), 0))
			return TC_ACT_SHOT;
	}
	if (mark)
		skb->mark = mark;
	return bpf_redirect(fib->ifindex, 0);
}

/* fwd_ct_alive returns the flags of the conntrack entry k if it exists,
 * is within its lifetime and has one of the flags want; else 0. */
static __always_inline __u32 fwd_ct_alive(struct ct_key *k, __u32 want)
{
	struct ct_value *v = bpf_map_lookup_elem(&ct, k);
	__u64 now, age = k->proto == IPPROTO_TCP ? CT_LIFETIME_TCP : CT_LIFETIME_OTHER;

	if (!v || !(v->flags & want))
		return 0;
	now = bpf_ktime_get_coarse_ns(); /* as endpoint.c's handle stamps them */
	return now > v->last_seen && now - v->last_seen > age ? 0 : v->flags;
}

/* FWD_SYN: what fwd_direct_conn returns for a TCP SYN (no entry). */
#define FWD_SYN 0x10000

/* fwd_direct_conn reports whether a TCP or UDP packet from another node
 * (saddr:sport -> daddr:dport, network order; tcp_flags: the TCP
 * header's flags byte) may go straight to local endpoint ep's host veth:
 * the other direction of its connection leaves this node the same way
 * (from_container's local_deliver with remote_direct), so that netfilter
 * sees both directions or neither. That is
 *   - a reply of a connection the endpoint opened to that address (its
 *     egress entry with CT_F_OPENED: its requests left straight,
 *     untranslated), or
 *   - a TCP SYN without ACK (a connection begins: its replies go back
 *     straight, CT_F_DIRECT), or
 *   - a later packet of a connection whose first one came so (the
 *     endpoint's ingress entry has CT_F_DIRECT).
 * Not: a reply of a connection the host's netfilter translated on its
 * way out (kube-proxy's DNAT of a ClusterIP: the endpoint's entry names
 * the ClusterIP, not this source), nor UDP of connections the remote
 * side began (a UDP reply of a translated request cannot be told from a
 * request). Returns 0 for no, else the entry's flags (FWD_SYN for a
 * SYN). */
static __always_inline __u32 fwd_direct_conn(__u32 ep, __u8 family, __u32 *saddr, __u32 *daddr, __u8 proto,
					     __u16 sport, __u16 dport, __u8 tcp_flags)
{
	struct ct_key k = { .ep = ep, .dir = DIR_EGRESS, .family = family, .proto = proto, .sport = dport, .dport = sport };
	__u32 f;

	__builtin_memcpy(k.saddr, daddr, 16);
	__builtin_memcpy(k.daddr, saddr, 16);
	f = fwd_ct_alive(&k, CT_F_OPENED);
	if (f)
		return f;
	if (proto != IPPROTO_TCP)
		return 0;
	if ((tcp_flags & (FWD_TCP_SYN | FWD_TCP_ACK)) == FWD_TCP_SYN)
		return FWD_SYN;
	k.dir = DIR_INGRESS;
	k.sport = sport;
	k.dport = dport;
	__builtin_memcpy(k.saddr, saddr, 16);
	__builtin_memcpy(k.daddr, daddr, 16);
	return fwd_ct_alive(&k, CT_F_DIRECT);
}

#endif
