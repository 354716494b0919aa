/* The host firewall (Cilium's host policies), included by endpoint.c
 * after lb.h. With the host firewall on (LinuxConfig.HostFirewall),
 * from_netdev runs at ingress and to_netdev at egress of the node's
 * devices (--devices); both decide on the node's own traffic only: a
 * packet to (ingress) or from (egress) an address the ipcache gives the
 * host identity. Traffic between the host and a local pod crosses no
 * device: the endpoint programs run the host's verdict on it
 * (host_local).
 *
 * The host endpoint is the endpoints entry at key HOST_EP_KEY (0, which
 * no interface has): endpoint ID 0, identity host, and a slot whose
 * policy maps hold the host identity's MapState, computed from the host
 * policies (nodeSelector) like a pod's. No entry: no host policy selects
 * the node, everything passes (as without the host firewall); an entry
 * whose maps are missing passes too (the node must stay reachable: the
 * agent writes the maps before the entry).
 *
 * Verdict, in direction dir of the host endpoint:
 *   1. non-IP frames, essential ICMPv6 (p->ndp) and ICMP errors pass (the
 *      node's path MTU discovery and neighbour discovery);
 *   2. a reply of a connection the host saw first in the other direction
 *      (conntrack, endpoint 0) passes; to_netdev records every connection
 *      the host opens, so replies to them pass ingress whatever the
 *      policy; a pod's packet masqueraded to the node's address
 *      (MARK_FROM_ENDPOINT_MAGIC, set by from_container) is recorded and
 *      passes: the pod's egress policy decided on it;
 *   3. if dir is enforced, the safety net (host_safe_net) passes what no
 *      host policy may drop; else the policy map and CIDR map decide as
 *      for a pod (deny entries first), dropping with DROP_POLICY or
 *      DROP_POLICY_DENY under endpoint 0, identity host;
 *   4. a passing packet records its connection (ep 0, dir).
 * In audit mode (the entry's ENDPOINT_F_AUDIT) a would-be drop of step 3
 * passes, reported as DROP_POLICY_AUDIT (fragments without an entry
 * still drop). The host endpoint has no L7 redirects (refused in host
 * policies). host_local (below) runs the same verdict, from the
 * endpoint programs, on traffic between the host and a local pod. */
#ifndef MEMBRANE_HOSTFW_H
#define MEMBRANE_HOSTFW_H

/* The host endpoint's key in endpoints: no interface has ifindex 0. */
#define HOST_EP_KEY 0

/* The node health responder's port (pkg/agent/health.Port). */
#define HOST_HEALTH_PORT 4240

/* Shared, pinned at <bpffs>/host_safe: the peers whose TCP traffic the
 * host exchanges whatever its policy (the API server the agent uses,
 * etcd in kvstore mode), as {family, proto, port, address}; port 0 is
 * any port of that address. Written by the datapath at Init. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct host_safe_key);
	__type(value, __u32);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} host_safe SEC(".maps");

/* host_safe_peer reports whether the peer's address and port (the source
 * at ingress, the destination at egress) is in host_safe. */
static __always_inline int host_safe_peer(struct pkt *p, __u8 dir)
{
	struct host_safe_key k = { .family = p->family, .proto = p->proto };

	if (p->proto != IPPROTO_TCP || p->frag)
		return 0;
	if (dir == DIR_EGRESS) {
		__builtin_memcpy(k.addr, p->daddr, 16);
		k.port = p->dport;
	} else {
		__builtin_memcpy(k.addr, p->saddr, 16);
		k.port = p->sport;
	}
	if (bpf_map_lookup_elem(&host_safe, &k))
		return 1;
	k.port = 0;
	return bpf_map_lookup_elem(&host_safe, &k) != NULL;
}

/* host_safe_net reports whether p is traffic no host policy drops (the
 * safety net, SECURITY.md): the agent's control plane (host_safe), and
 * between the node and another node (identity remote-node, a per-node
 * identity, or kube-apiserver, which other nodes' API servers carry): ICMP and ICMPv6
 * echo, TCP to the health responder's port and UDP to the tunnel port
 * (tunnel mode). Replies pass as conntrack replies. */
static __always_inline int host_safe_net(struct pkt *p, __u8 dir, __u32 peer)
{
	__u32 zero = 0;
	struct node_config_value *c;

	if (host_safe_peer(p, dir))
		return 1;
	if (!is_remote_node(peer))
		return 0;
	if ((p->proto == IPPROTO_ICMP && p->policy_port == (0x100 | 8)) ||
	    (p->proto == IPPROTO_ICMPV6 && p->policy_port == (0x100 | 128)))
		return 1;
	if (p->frag)
		return 0;
	if (p->proto == IPPROTO_TCP && bpf_ntohs(p->dport) == HOST_HEALTH_PORT)
		return 1;
	c = bpf_map_lookup_elem(&node_config, &zero);
	return c && c->tunnel_port && p->proto == IPPROTO_UDP && bpf_ntohs(p->dport) == c->tunnel_port;
}

/* host_verdict decides on p at a device in direction dir of the host
 * endpoint (see the header comment). forwarded: an egress packet a pod's
 * program let out (MARK_FROM_ENDPOINT_MAGIC), masqueraded to the node's
 * address: no host verdict, only its connection recorded, so that its
 * replies pass ingress whatever the host's ingress policy. */
static __noinline int host_verdict(struct __sk_buff *skb, struct pkt *p, __u8 dir, int forwarded)
{
	__u32 key = HOST_EP_KEY, slot, peer;
	struct endpoint_info *ep;
	struct policy_value *v;
	void *pol, *cidr;
	__u64 now;
	int r = 0, audit;

	ep = bpf_map_lookup_elem(&endpoints, &key);
	if (!ep || p->family == 0 || p->ndp || (p->icmp_err && !p->frag))
		return TC_ACT_OK;
	/* The host's side: the destination at ingress, the source at
	 * egress. */
	if (peer_identity(p, dir ^ 1) != IDENTITY_HOST)
		return TC_ACT_OK;
	slot = ep->slot;
	audit = !!(ep->flags & ENDPOINT_F_AUDIT);
	pol = bpf_map_lookup_elem(&policy_maps, &slot);
	cidr = bpf_map_lookup_elem(&cidr_maps, &slot);
	if (!pol || !cidr)
		return TC_ACT_OK;
	p->ep = ep->id;
	p->identity = IDENTITY_HOST;
	now = bpf_ktime_get_ns();
	if (!p->frag && ct_is_reply(p, dir, now))
		return TC_ACT_OK;
	if (forwarded)
		goto pass;
	if (enforce_entry(pol, dir)) {
		peer = peer_identity(p, dir);
		if (host_safe_net(p, dir, peer))
			goto pass;
		v = policy_lookup(pol, peer, p, dir);
		if (v) {
			__sync_fetch_and_add(&v->packets, 1);
			__sync_fetch_and_add(&v->bytes, skb->len);
			if (v->deny)
				r = DROP_POLICY_DENY;
		}
		if (!r && cidr_match(cidr, p, dir | CIDR_DIR_DENY, skb->len))
			r = DROP_POLICY_DENY;
		if (!r && !v && !cidr_match(cidr, p, dir, skb->len))
			r = p->frag ? DROP_FRAGMENT : DROP_POLICY;
		if (r) {
			/* Audit mode: a would-be policy drop passes,
			 * reported as DROP_POLICY_AUDIT. */
			if (!audit || r == DROP_FRAGMENT)
				return drop(skb, p, dir, r, peer);
			drop(skb, p, dir, DROP_POLICY_AUDIT, peer);
		}
	}
pass:
	if (!p->frag)
		ct_record(p, dir, now);
	return TC_ACT_OK;
}

/* host_local runs the host endpoint's verdict on traffic between a
 * local pod and the host, which never crosses a device (Cilium's
 * bpf_lxc tail-calls the host's policy program the same way): what the
 * pod sends to a host address (from_container, dir DIR_EGRESS of the pod)
 * meets the host's ingress policy after the pod's egress policy passed
 * it; what the host sends the pod (to_container, dir DIR_INGRESS) meets
 * the host's egress policy before the pod's ingress policy. The host's
 * verdict records its connection under endpoint 0, drops count there;
 * p gets the pod's endpoint back. Packets the L7 proxy or a tunnel
 * delivered on a peer's behalf (their marks) are not the host's: host_verdict also passes whatever does not have a host address
 * on the host's side. */
static __always_inline int host_local(struct __sk_buff *skb, struct pkt *p, __u8 dir)
{
	__u32 ep = p->ep, id = p->identity;
	int r;

	if (dir == DIR_INGRESS && (from_proxy(skb) || (skb->mark & MARK_MAGIC_MASK) == MARK_IDENTITY_MAGIC))
		return TC_ACT_OK;
	r = host_verdict(skb, p, dir ^ 1, 0);
	p->ep = ep;
	p->identity = id;
	return r;
}

#endif
