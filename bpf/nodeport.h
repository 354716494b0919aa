/* NodePort and external-address traffic from outside the node, in the
 * kube-proxy-free mode: from_netdev (endpoint.c) runs at TCX ingress of
 * the node's uplink devices and translates packets to a frontend flagged
 * LB_FLAG_EXTERNAL, as Cilium's nodeport.h does:
 *
 *   - a local backend (LB_BACKEND_LOCAL): DNAT only, then a FIB lookup
 *     and bpf_redirect_neigh to the pod's host veth (its to-container
 *     program sees the client's address). The reply is
 *     reverse-translated after the backend's from-container (an
 *     lb_revnat entry flagged LB_REVNAT_NODEPORT; nodeport_reply) and
 *     sent to the uplink the same way: the stack would drop a forwarded
 *     packet whose source is the node's own address. Neither direction
 *     passes the stack's forwarding (nor netfilter), so no half-open
 *     conntrack entry is left behind. The request is marked
 *     MARK_NODEPORT_MAGIC, so that the backend's to-container records its
 *     connection as NodePort-translated (CT_F_NODEPORT): only replies of
 *     such a connection are reverse-translated, not those of a later one
 *     from the same client address and port reaching the pod untranslated
 *     (routed to its address, or DNATed by kube-proxy).
 *   - a remote backend: DNAT and SNAT to the frontend's address (the
 *     node address the client reached) with a NAT port from
 *     LB_NAT_PORT_MIN.. (outside the kernel's default ephemeral range),
 *     then FIB lookup and redirect to the backend's node; the reply
 *     (lb_nat_rev) is translated back to frontend -> client here and
 *     redirected to the client the same way.
 *
 * externalTrafficPolicy: Local is a frontend of two scopes
 * (LB_FLAG_TWO_SCOPES): here, for traffic from outside, the
 * LB_SCOPE_EXTERNAL entry holds only this node's pods, so it never SNATs
 * and the client's address is preserved (none: dropped); the node's own
 * sockets and its pods use the internal entry, every backend.
 * Redirected packets get their TTL (hop limit) decremented, as the
 * stack's forwarding would; one that runs out is dropped (no ICMP).
 */
#ifndef MEMBRANE_NODEPORT_H
#define MEMBRANE_NODEPORT_H

#define LB_NAT_PORT_MIN 61000
#define LB_NAT_PORT_COUNT 4536 /* 61000..65535 */
#define LB_NAT_TRIES 64
/* A NAT port of a connection that saw a FIN frees after this without
 * traffic (as Cilium's CT close timeout), after an RST sooner. */
#define LB_NAT_CLOSING_NS (10ULL * 1000000000ULL)
#define LB_NAT_RESET_NS (1ULL * 1000000000ULL)
#define LB_CLOSING_FIN 1
#define LB_CLOSING_RST 2

#define AF_INET_ 2
#define AF_INET6_ 10

/* lb_tcp_closing reports a TCP RST (LB_CLOSING_RST) or FIN
 * (LB_CLOSING_FIN), else 0. */
static __always_inline __u32 lb_tcp_closing(struct __sk_buff *skb, struct pkt *p)
{
	__u8 flags;

	if (p->proto != IPPROTO_TCP || bpf_skb_load_bytes(skb, p->l4off + 13, &flags, 1))
		return 0;
	if (flags & 0x04)
		return LB_CLOSING_RST;
	return (flags & 0x01) ? LB_CLOSING_FIN : 0;
}

/* lb_fib_redirect sends a translated packet out of the device the FIB
 * names for its destination, resolving the next hop's neighbour, with
 * its TTL decremented. */
static __noinline int lb_fib_redirect(struct __sk_buff *skb, struct pkt *p)
{
	struct bpf_fib_lookup fib = { .l4_protocol = p->proto, .sport = p->sport, .dport = p->dport };
	struct bpf_redir_neigh nh = {};
	long r;

	if (fwd_ttl_dec(skb, p->family))
		return -1;

	fib.ifindex = skb->ifindex;
	if (p->family == 4) {
		fib.family = AF_INET_;
		fib.ipv4_src = p->saddr[0];
		fib.ipv4_dst = p->daddr[0];
	} else {
		fib.family = AF_INET6_;
		__builtin_memcpy(fib.ipv6_src, p->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, p->daddr, 16);
	}
	r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r != BPF_FIB_LKUP_RET_SUCCESS && r != BPF_FIB_LKUP_RET_NO_NEIGH)
		return -1;
	if (p->family == 4) {
		nh.nh_family = AF_INET_;
		nh.ipv4_nh = fib.ipv4_dst; /* the gateway if the route has one */
	} else {
		nh.nh_family = AF_INET6_;
		__builtin_memcpy(nh.ipv6_nh, fib.ipv6_dst, 16);
	}
	return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
}

/* lb_nat_reply translates the reply of a SNATed NodePort connection
 * (backend -> node:NAT port) to frontend -> client. Returns 1 if it did,
 * 0 if the packet is no such reply, -1 on error. */
static __noinline int lb_nat_reply(struct __sk_buff *skb, struct pkt *p)
{
	struct lb_tuple t = { .sport = p->sport, .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_natrev_value *rv;
	__u32 client[4], fe[4], closing;
	__u16 cport, fport;

	__builtin_memcpy(t.saddr, p->saddr, 16);
	__builtin_memcpy(t.daddr, p->daddr, 16);
	rv = bpf_map_lookup_elem(&lb_nat_rev, &t);
	if (!rv)
		return 0;
	rv->last_seen = bpf_ktime_get_ns();
	closing = lb_tcp_closing(skb, p);
	if (closing > rv->closing)
		rv->closing = closing;
	__builtin_memcpy(client, rv->client, 16);
	__builtin_memcpy(fe, rv->frontend, 16);
	cport = rv->client_port;
	fport = rv->frontend_port;
	if (lb_rewrite(skb, p, fe, fport, 1) || lb_rewrite(skb, p, client, cport, 0))
		return -1;
	return 1;
}

/* lb_nat_free reports whether a NAT entry may be given to a new
 * connection: none, or one of a connection gone quiet or closed. */
static __always_inline int lb_nat_free(struct lb_natrev_value *e, struct pkt *p, __u64 now)
{
	if (!e)
		return 1;
	if (e->closing == LB_CLOSING_RST && older_than(e->last_seen, now, LB_NAT_RESET_NS))
		return 1;
	if (e->closing && older_than(e->last_seen, now, LB_NAT_CLOSING_NS))
		return 1;
	if (older_than(e->last_seen, now, ct_lifetime(p->proto)))
		return 1;
	/* The same client connecting again (a retransmitted SYN). */
	return e->client_port == p->sport && e->client[0] == p->saddr[0] && e->client[1] == p->saddr[1] &&
	       e->client[2] == p->saddr[2] && e->client[3] == p->saddr[3];
}

/* lb_nat_claim finds a NAT port for the connection p (still client ->
 * frontend) to backend b and records its reply's translation. Returns
 * the port (network order), 0 if none is free. */
static __noinline __u16 lb_nat_claim(struct __sk_buff *skb, struct pkt *p, struct lb_backend *b, __u64 now)
{
	struct lb_tuple rt = { .sport = b->port, .proto = p->proto, .family = p->family };
	struct lb_natrev_value rv = { .last_seen = now, .client_port = p->sport, .frontend_port = p->dport };
	__u32 h = bpf_get_hash_recalc(skb);
	struct lb_natrev_value *e;
	int i;

	__builtin_memcpy(rt.saddr, b->addr, 16);
	__builtin_memcpy(rt.daddr, p->daddr, 16);
	__builtin_memcpy(rv.client, p->saddr, 16);
	__builtin_memcpy(rv.frontend, p->daddr, 16);
	for (i = 0; i < LB_NAT_TRIES; i++) {
		/* Linear probing from the flow's hash. */
		rt.dport = bpf_htons(LB_NAT_PORT_MIN + (h + i) % LB_NAT_PORT_COUNT);
		e = bpf_map_lookup_elem(&lb_nat_rev, &rt);
		if (lb_nat_free(e, p, now) && !bpf_map_update_elem(&lb_nat_rev, &rt, &rv, BPF_ANY))
			return rt.dport;
	}
	return 0;
}

/* lb_nodeport_local records the reverse translation of a NodePort
 * connection to a local backend, done at its from-container. */
static __noinline void lb_nodeport_local(struct pkt *p, struct lb_backend *b, __u64 now)
{
	struct lb_revnat_value rv = { .last_seen = now, .port = p->dport, .flags = LB_REVNAT_NODEPORT };
	struct lb_tuple t = { .proto = p->proto, .family = p->family, .dport = p->sport, .sport = b->port };

	__builtin_memcpy(t.saddr, b->addr, 16);
	__builtin_memcpy(t.daddr, p->saddr, 16);
	__builtin_memcpy(rv.addr, p->daddr, 16);
	bpf_map_update_elem(&lb_revnat, &t, &rv, BPF_ANY);
}

/* lb_affinity_set records that the client of ak used backend b (slot). */
static __noinline void lb_affinity_set(struct lb_affinity_key *ak, struct lb_backend *b, __u32 slot, __u64 now)
{
	struct lb_affinity_value av = { .last_used = now, .backend = *b, .slot = slot };

	bpf_map_update_elem(&lb_affinity, ak, &av, BPF_ANY);
}

/* lb_nodeport_new picks the backend of a new NodePort connection and
 * records it (nv), with the reverse translation of its replies. */
static __noinline int lb_nodeport_new(struct __sk_buff *skb, struct pkt *p, struct lb_service *svc,
				      struct lb_nat_value *nv, __u64 now)
{
	struct lb_affinity_key ak = { .id = svc->id, .family = p->family };
	struct lb_backend *b = NULL;
	__u32 slot;

	if (svc->count == 0)
		return LB_NO_BACKEND;
	__builtin_memcpy(ak.client, p->saddr, 16);
	slot = lb_pick(skb, p, svc, &ak, now, &b);
	if (!slot || !b)
		return LB_NO_BACKEND;
	nv->last_seen = now;
	nv->backend = *b;
	nv->id = svc->id;
	nv->nat_port = 0;
	if (svc->flags & LB_FLAG_AFFINITY)
		lb_affinity_set(&ak, &nv->backend, slot, now);
	if (nv->backend.flags & LB_BACKEND_LOCAL) {
		lb_nodeport_local(p, &nv->backend, now);
		return LB_PASS;
	}
	nv->nat_port = lb_nat_claim(skb, p, &nv->backend, now);
	return nv->nat_port ? LB_PASS : LB_NAT_EXHAUSTED;
}

/* lb_nat_closing marks a SNATed connection's reply entry closing (how:
 * LB_CLOSING_*). */
static __noinline void lb_nat_closing(struct pkt *p, struct lb_nat_value *nv, __u32 *fe, __u32 how)
{
	struct lb_tuple rt = { .sport = nv->backend.port, .dport = nv->nat_port, .proto = p->proto, .family = p->family };
	struct lb_natrev_value *e;

	__builtin_memcpy(rt.saddr, nv->backend.addr, 16);
	__builtin_memcpy(rt.daddr, fe, 16);
	e = bpf_map_lookup_elem(&lb_nat_rev, &rt);
	if (e && how > e->closing)
		e->closing = how;
}

/* lb_nodeport translates a packet arriving on the uplink: the reply of
 * a SNATed connection, or a packet to an external frontend. Returns
 * LB_PASS (not ours), LB_REDIRECT (translated; lb_fib_redirect sends
 * it) or an error. */
static __noinline int lb_nodeport(struct __sk_buff *skb, struct pkt *p)
{
	struct lb_key fk = { .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_tuple t = { .sport = p->sport, .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_nat_value nv = {}, *cv;
	struct lb_service *svc;
	__u32 fe[4];
	__u64 now;
	int r;

	if (p->frag || !lb_proto_ok(p->proto))
		return LB_PASS;
	r = lb_nat_reply(skb, p);
	if (r)
		return r < 0 ? LB_ERROR : LB_REDIRECT;
	__builtin_memcpy(fk.addr, p->daddr, 16);
	svc = bpf_map_lookup_elem(&lb_frontends, &fk);
	if (!svc || !(svc->flags & LB_FLAG_EXTERNAL))
		return LB_PASS;
	if (svc->flags & LB_FLAG_TWO_SCOPES) {
		fk.scope = LB_SCOPE_EXTERNAL;
		svc = bpf_map_lookup_elem(&lb_frontends, &fk);
		if (!svc)
			return LB_NO_BACKEND;
	}
	now = bpf_ktime_get_ns();
	__builtin_memcpy(t.saddr, p->saddr, 16);
	__builtin_memcpy(t.daddr, p->daddr, 16);
	cv = bpf_map_lookup_elem(&lb_nat, &t);
	if (cv && cv->id == svc->id && !lb_tcp_new(skb, p) && !older_than(cv->last_seen, now, ct_lifetime(p->proto))) {
		cv->last_seen = now;
		nv = *cv;
	} else {
		r = lb_nodeport_new(skb, p, svc, &nv, now);
		if (r != LB_PASS)
			return r;
		bpf_map_update_elem(&lb_nat, &t, &nv, BPF_ANY);
	}
	__builtin_memcpy(fe, p->daddr, 16);
	if (lb_rewrite(skb, p, nv.backend.addr, nv.backend.port, 0))
		return LB_ERROR;
	if (!nv.nat_port) {
		skb->mark = MARK_NODEPORT_MAGIC;
		return LB_REDIRECT; /* to the local pod's veth */
	}
	r = lb_tcp_closing(skb, p);
	if (r)
		lb_nat_closing(p, &nv, fe, r);
	if (lb_rewrite(skb, p, fe, nv.nat_port, 1))
		return LB_ERROR;
	return LB_REDIRECT;
}

#endif
