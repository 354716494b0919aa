/* Service load balancing of the endpoint programs: a packet a pod sends
 * to a service frontend (virtual address, port, protocol) is translated
 * to one of the frontend's backends (DNAT) before conntrack and policy
 * see it, and the replies are translated back (the backend's address
 * and port become the frontend's again) as they reach the pod. Included
 * by endpoint.c after struct pkt and drop(); kept apart from it so that
 * the service code is one unit.
 *
 *   lb_frontends  frontend (and scope) -> {id, backend count, affinity}
 *   lb_backends   {id, slot 1..count} -> backend (address, port)
 *   lb_ct         the client's tuple (to the frontend) -> its backend
 *   lb_revnat     the reply's tuple (from the backend) -> the frontend,
 *                 used only for replies whose conntrack entry says the
 *                 connection was translated (ct_value.flags, ct_reverse)
 *   lb_affinity   {id, client address} -> the backend it used last
 *   lb_nat, lb_nat_rev  NodePort connections from outside (nodeport.h)
 *   lb_sock       socket-level translations (sock.c)
 *
 * A packet to a frontend that is a reply of a connection the pod's peer
 * opened (conntrack: ct_peer_opened) is not translated: the peer's
 * address and port only happen to be a frontend's (the node's address
 * and a NodePort or hostPort: a host process bound there, a masquerade
 * with random ports such as kube-proxy's).
 *
 * Backend choice: a TCP SYN (no ACK) or a packet of no known connection
 * picks slot hash(flow) % count + 1 (the ClientIP affinity entry's slot
 * instead while fresh and still holding the same backend); any other
 * packet of a known connection keeps the backend it has (lb_ct), also
 * after the backend left the service: established connections are
 * drained, not reset, and only new connections avoid a removed backend.
 * count 0 (no ready backend) drops new connections (DROP_NO_BACKEND).
 * Non-first fragments carry no ports and are not translated.
 *
 * Hairpin (a client whose chosen backend is itself, Cilium's loopback
 * service): the source also becomes the hairpin address (LB_HAIRPIN_V4
 * 169.254.42.1, Cilium's default --ipv4-service-loopback-address, or
 * LB_HAIRPIN_V6), else the pod would receive a packet from its own
 * address, which its stack drops as martian, and answer itself past the
 * translation. The revnat entry is keyed by the reply to the hairpin
 * address and flagged LB_REVNAT_HAIRPIN: its reverse translation also
 * gives the reply the client (the backend itself) as destination. Both
 * directions go straight back into the pod (lb_hairpin_redirect: the
 * same veth's egress, so to_container sees them), never through the
 * host's stack, which would send redirects (IPv6) or route the hairpin
 * address away.
 *
 * ICMP errors (lb_icmp_related, both directions: IPv4 destination
 * unreachable, time exceeded, parameter problem; ICMPv6 errors 1-4)
 * quoting a packet of one of the endpoint's connections are related and
 * pass, as conntrack's RELATED. To_container, an error about a
 * translated flow quotes the packet as translated (to the backend): the
 * quoted destination becomes the frontend again (address, port, the
 * quoted IPv4 checksum, the ICMP checksum), and the error's own source
 * too when the backend itself sent it, so the pod's stack finds its
 * socket (path MTU discovery through a Service). The quoted transport
 * checksum is left as it is: it may be cut off, and no stack checks it
 * in an error.
 */
#ifndef MEMBRANE_LB_H
#define MEMBRANE_LB_H

/* lb_service.flags */
#define LB_FLAG_AFFINITY 1
/* The frontend is reached from outside the node (NodePort, external
 * address): from_netdev translates it on the node's uplink. */
#define LB_FLAG_EXTERNAL 2
/* The frontend is a loopback address (a hostPort with hostIP 127.0.0.1
 * or ::1, Cilium's loopback HostPort): the socket programs translate it
 * only for sockets in the node's own network namespace, where it is the
 * node's localhost; a pod's localhost is its own. */
#define LB_FLAG_HOSTNS 4
/* The frontend has two scopes (externalTrafficPolicy Local, as Cilium's
 * SVC_FLAG_TWO_SCOPES): this entry (LB_SCOPE_INTERNAL, every backend)
 * serves the node's own sockets and its pods (sock.c, lb_translate),
 * and traffic arriving from outside (from_netdev) takes the
 * LB_SCOPE_EXTERNAL entry of the same frontend (only this node's
 * backends); while that entry is missing it finds no backend. */
#define LB_FLAG_TWO_SCOPES 8

/* lb_key.scope. A one-scope frontend has only LB_SCOPE_INTERNAL, which
 * every path uses. */
#define LB_SCOPE_INTERNAL 0
#define LB_SCOPE_EXTERNAL 1

/* lb_backend.flags: the backend is a pod on this node (NodePort traffic
 * to it is only DNATed; to a remote one also SNATed). */
#define LB_BACKEND_LOCAL 1

/* lb_revnat_value.flags: a NodePort connection to a local backend,
 * reverse-translated at the backend's from-container (not at a client
 * pod's to-container) and sent to the uplink from there. */
#define LB_REVNAT_NODEPORT 1
/* lb_revnat_value.flags: the reply of a hairpin connection (keyed by
 * its tuple from the backend to the hairpin address): the destination
 * becomes the client (the backend's own address) too. */
#define LB_REVNAT_HAIRPIN 2

/* The hairpin source addresses (network byte order words):
 * 169.254.42.1 and 100::a9fe:2a01 (the discard-only prefix, RFC 6666,
 * 169.254.42.1 in its low bits): a pod never owns either, and neither
 * leaves the pod's veth. */
#define LB_HAIRPIN_V4 0xa9fe2a01 /* host order */
#define LB_HAIRPIN_V6_HI 0x01000000 /* the first word, host order */

/* Drop reasons of enum drop_reason's numbering (datapath.DropNoBackend,
 * DropNoRoute, DropNATExhausted). */
#define DROP_NO_BACKEND 5
#define DROP_NO_ROUTE 16
#define DROP_NAT_EXHAUSTED 17

/* lb_key is a frontend in a scope. IPv4 uses addr[0] and zeroes the
 * rest. */
struct lb_key {
	__u32 addr[4]; /* network byte order bytes */
	__u16 dport;   /* network byte order */
	__u8 proto;
	__u8 family; /* 4 or 6 */
	__u8 scope;  /* LB_SCOPE_* */
	__u8 pad[3];
};

/* lb_service: the frontend's backends are lb_backends {id, 1..count}. */
struct lb_service {
	__u32 id;
	__u32 count;
	__u32 affinity; /* ClientIP affinity timeout, seconds (0: none) */
	__u32 flags;
};

struct lb_slot_key {
	__u32 id;
	__u32 slot;
};

struct lb_backend {
	__u32 addr[4];
	__u16 port; /* network byte order */
	__u8 family;
	__u8 flags; /* LB_BACKEND_* */
};

/* lb_tuple is a connection's tuple in one direction. */
struct lb_tuple {
	__u32 saddr[4];
	__u32 daddr[4];
	__u16 sport; /* network byte order */
	__u16 dport;
	__u8 proto;
	__u8 family;
	__u16 pad;
};

/* lb_ct_value: the backend the connection (keyed by the client's tuple
 * to the frontend) was translated to. */
struct lb_ct_value {
	__u64 last_seen; /* bpf_ktime_get_ns */
	struct lb_backend backend;
	__u32 id;
	__u32 slot;
};

/* lb_revnat_value: the frontend the replies' source is rewritten to. */
struct lb_revnat_value {
	__u64 last_seen;
	__u32 addr[4];
	__u16 port;
	__u16 flags; /* LB_REVNAT_* */
	__u32 pad2;
};

struct lb_affinity_key {
	__u32 id;
	__u8 family;
	__u8 pad[3];
	__u32 client[4];
};

struct lb_affinity_value {
	__u64 last_used; /* bpf_ktime_get_ns */
	struct lb_backend backend;
	__u32 slot;
	__u32 pad;
};

/* lb_nat_value: a NodePort connection (keyed by the client's tuple to
 * the frontend, as it arrives on the uplink) and its backend. */
struct lb_nat_value {
	__u64 last_seen;
	struct lb_backend backend;
	__u32 id;
	__u16 nat_port; /* network byte order; 0: local backend, no SNAT */
	__u16 pad;
};

/* lb_natrev_value: the reply of a SNATed NodePort connection (keyed by
 * its tuple from the backend to the node address and NAT port) goes back
 * to the client from the frontend. */
struct lb_natrev_value {
	__u64 last_seen;
	__u32 client[4];
	__u32 frontend[4];
	__u16 client_port;
	__u16 frontend_port;
	__u32 closing; /* 1: a FIN was seen, 2: an RST: the NAT port frees sooner */
};

/* lb_sock_key: a socket the socket-level hooks translated (its cookie)
 * and the backend it was given. */
struct lb_sock_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port; /* network byte order */
	__u8 family;
	__u8 pad;
	__u32 pad2;
};

/* lb_sock_value: the frontend the socket asked for. */
struct lb_sock_value {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

#ifdef __BPF__

/* Shared, pinned at <bpffs>/lb_frontends. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_key);
	__type(value, struct lb_service);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} lb_frontends SEC(".maps");

/* Shared, pinned at <bpffs>/lb_backends. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct lb_slot_key);
	__type(value, struct lb_backend);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} lb_backends SEC(".maps");

/* Shared, pinned at <bpffs>/lb_ct. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_tuple);
	__type(value, struct lb_ct_value);
	__uint(max_entries, 65536);
} lb_ct SEC(".maps");

/* Shared, pinned at <bpffs>/lb_revnat. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_tuple);
	__type(value, struct lb_revnat_value);
	__uint(max_entries, 65536);
} lb_revnat SEC(".maps");

/* Shared, pinned at <bpffs>/lb_affinity. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_affinity_key);
	__type(value, struct lb_affinity_value);
	__uint(max_entries, 65536);
} lb_affinity SEC(".maps");

/* Shared, pinned at <bpffs>/lb_nat: NodePort connections (from_netdev). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_tuple);
	__type(value, struct lb_nat_value);
	__uint(max_entries, 65536);
} lb_nat SEC(".maps");

/* Shared, pinned at <bpffs>/lb_nat_rev: SNATed NodePort replies. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_tuple);
	__type(value, struct lb_natrev_value);
	__uint(max_entries, 65536);
} lb_nat_rev SEC(".maps");

/* Shared, pinned at <bpffs>/lb_progs: slot LB_PROG_NODEPORT_REPLY holds
 * nodeport_reply while the kube-proxy-free mode runs (datapath fills it
 * with the uplink program). A tail call keeps the FIB redirect out of
 * every endpoint's from-container, which the kernel verifies per load. */
#define LB_PROG_NODEPORT_REPLY 0
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
	__uint(max_entries, 1);
} lb_progs SEC(".maps");

/* Shared, pinned at <bpffs>/lb_sock: the socket-level translations
 * (sock.c), for recvmsg and getpeername. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct lb_sock_key);
	__type(value, struct lb_sock_value);
	__uint(max_entries, 65536);
} lb_sock SEC(".maps");

#ifndef LB_MAPS_ONLY

#define IP4_CSUM_OFF (ETH_HLEN_ + 10)
#define IP4_SADDR_OFF (ETH_HLEN_ + 12)
#define IP4_DADDR_OFF (ETH_HLEN_ + 16)
#define IP6_SADDR_OFF (ETH_HLEN_ + 8)
#define IP6_DADDR_OFF (ETH_HLEN_ + 24)

enum { LB_PASS, LB_NO_BACKEND, LB_ERROR, LB_REDIRECT, LB_NAT_EXHAUSTED, LB_HAIRPIN };

/* lb_hairpin_addr sets a to the hairpin address of family. */
static __always_inline void lb_hairpin_addr(__u8 family, __u32 *a)
{
	a[1] = a[2] = 0;
	if (family == 4) {
		a[0] = bpf_htonl(LB_HAIRPIN_V4);
		a[3] = 0;
	} else {
		a[0] = bpf_htonl(LB_HAIRPIN_V6_HI);
		a[3] = bpf_htonl(LB_HAIRPIN_V4);
	}
}

/* lb_is_hairpin reports whether addr is family's hairpin address. */
static __always_inline int lb_is_hairpin(__u8 family, __u32 *addr)
{
	__u32 h[4];

	lb_hairpin_addr(family, h);
	return addr[0] == h[0] && addr[1] == h[1] && addr[2] == h[2] && addr[3] == h[3];
}

static __always_inline int lb_addr_eq(const __u32 *a, const __u32 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3];
}

static __always_inline int lb_proto_ok(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

/* lb_rewrite sets the packet's source (src) or destination address and
 * port to addr/port, with the IP and transport checksums. */
static __noinline int lb_rewrite(struct __sk_buff *skb, struct pkt *p, __u32 *addr, __u16 port, int src)
{
	__u32 *old = src ? p->saddr : p->daddr;
	__u16 oldport = src ? p->sport : p->dport;
	__u32 csum_off = p->l4off + (p->proto == IPPROTO_TCP ? 16 : 6);
	__u32 port_off = p->l4off + (src ? 0 : 2);
	__u64 flags = BPF_F_PSEUDO_HDR;
	__u32 addr_off;
	__s64 diff;
	__u16 csum;

	if (p->proto == IPPROTO_UDP) {
		/* A zero UDP checksum (IPv4: none) stays zero. */
		if (bpf_skb_load_bytes(skb, csum_off, &csum, 2))
			return -1;
		if (csum == 0 && p->family == 4)
			csum_off = 0;
		flags |= BPF_F_MARK_MANGLED_0;
	}
	if (p->family == 4) {
		addr_off = src ? IP4_SADDR_OFF : IP4_DADDR_OFF;
		if (bpf_l3_csum_replace(skb, IP4_CSUM_OFF, old[0], addr[0], 4))
			return -1;
		if (csum_off && bpf_l4_csum_replace(skb, csum_off, old[0], addr[0], flags | 4))
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, addr, 4, 0))
			return -1;
	} else {
		addr_off = src ? IP6_SADDR_OFF : IP6_DADDR_OFF;
		diff = bpf_csum_diff(old, 16, addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, flags))
			return -1;
		if (bpf_skb_store_bytes(skb, addr_off, addr, 16, 0))
			return -1;
	}
	if (port != oldport) {
		if (csum_off && bpf_l4_csum_replace(skb, csum_off, oldport, port, 2 | (p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0)))
			return -1;
		if (bpf_skb_store_bytes(skb, port_off, &port, 2, 0))
			return -1;
	}
	__builtin_memcpy(old, addr, 16);
	if (src)
		p->sport = port;
	else
		p->dport = port;
	return 0;
}

/* lb_tcp_new reports a TCP SYN without ACK: a new connection. */
static __always_inline int lb_tcp_new(struct __sk_buff *skb, struct pkt *p)
{
	__u8 flags;

	if (p->proto != IPPROTO_TCP || bpf_skb_load_bytes(skb, p->l4off + 13, &flags, 1))
		return 0;
	return (flags & 0x12) == 0x02;
}

/* lb_pick returns the backend slot for a new connection of svc, or 0. */
static __always_inline __u32 lb_pick(struct __sk_buff *skb, struct pkt *p, struct lb_service *svc,
				     struct lb_affinity_key *ak, __u64 now, struct lb_backend **out)
{
	struct lb_affinity_value *av;
	struct lb_slot_key sk = { .id = svc->id };
	struct lb_backend *b;

	if (svc->flags & LB_FLAG_AFFINITY) {
		av = bpf_map_lookup_elem(&lb_affinity, ak);
		if (av && !older_than(av->last_used, now, (__u64)svc->affinity * 1000000000ULL) && av->slot <= svc->count) {
			sk.slot = av->slot;
			b = bpf_map_lookup_elem(&lb_backends, &sk);
			if (b && b->port == av->backend.port && b->addr[0] == av->backend.addr[0] &&
			    b->addr[1] == av->backend.addr[1] && b->addr[2] == av->backend.addr[2] &&
			    b->addr[3] == av->backend.addr[3]) {
				*out = b;
				return sk.slot;
			}
		}
	}
	sk.slot = bpf_get_hash_recalc(skb) % svc->count + 1;
	b = bpf_map_lookup_elem(&lb_backends, &sk);
	if (!b)
		return 0;
	*out = b;
	return sk.slot;
}

/* lb_translate translates a packet the pod sends to a frontend (DNAT),
 * recording the connection and its reverse translation. */
static __noinline int lb_translate(struct __sk_buff *skb, struct pkt *p)
{
	struct lb_key fk = { .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_tuple t = { .sport = p->sport, .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_affinity_key ak = { .family = p->family };
	struct lb_revnat_value rv = {};
	struct lb_ct_value nv = {};
	struct lb_ct_value *cv;
	struct lb_service *svc;
	struct lb_backend *b = NULL;
	__u32 hp[4];
	__u64 now;
	__u32 slot;
	int hairpin;

	if (p->frag || !lb_proto_ok(p->proto))
		return LB_PASS;
	__builtin_memcpy(fk.addr, p->daddr, 16);
	svc = bpf_map_lookup_elem(&lb_frontends, &fk);
	if (!svc)
		return LB_PASS;
	now = bpf_ktime_get_ns();
	/* A reply to a peer whose address and port are a frontend's
	 * belongs to the peer's connection (conntrack decides next). */
	if (ct_peer_opened(p, now))
		return LB_PASS;
	__builtin_memcpy(t.saddr, p->saddr, 16);
	__builtin_memcpy(t.daddr, p->daddr, 16);
	cv = bpf_map_lookup_elem(&lb_ct, &t);
	if (cv && cv->id == svc->id && !lb_tcp_new(skb, p) &&
	    !older_than(cv->last_seen, now, ct_lifetime(p->proto))) {
		cv->last_seen = now;
		nv.backend = cv->backend;
	} else {
		if (svc->count == 0)
			return LB_NO_BACKEND;
		ak.id = svc->id;
		__builtin_memcpy(ak.client, p->saddr, 16);
		slot = lb_pick(skb, p, svc, &ak, now, &b);
		if (!slot || !b)
			return LB_NO_BACKEND;
		nv.last_seen = now;
		nv.backend = *b;
		nv.id = svc->id;
		nv.slot = slot;
		bpf_map_update_elem(&lb_ct, &t, &nv, BPF_ANY);
		if (svc->flags & LB_FLAG_AFFINITY) {
			struct lb_affinity_value av = { .last_used = now, .backend = *b, .slot = slot };

			bpf_map_update_elem(&lb_affinity, &ak, &av, BPF_ANY);
		}
		/* The replies' tuple: from the backend to the client (to the
		 * hairpin address for a hairpin). Lookups of every reply keep it
		 * in the LRU while the connection lives. */
		__builtin_memcpy(t.saddr, nv.backend.addr, 16);
		__builtin_memcpy(t.daddr, p->saddr, 16);
		if (lb_addr_eq(nv.backend.addr, p->saddr)) {
			lb_hairpin_addr(p->family, t.daddr);
			rv.flags = LB_REVNAT_HAIRPIN;
		}
		t.sport = nv.backend.port;
		t.dport = p->sport;
		rv.last_seen = now;
		__builtin_memcpy(rv.addr, p->daddr, 16);
		rv.port = p->dport;
		bpf_map_update_elem(&lb_revnat, &t, &rv, BPF_ANY);
	}
	hairpin = lb_addr_eq(nv.backend.addr, p->saddr);
	if (lb_rewrite(skb, p, nv.backend.addr, nv.backend.port, 0))
		return LB_ERROR;
	p->bits |= PKT_SVC; /* the flow's frontend: flow_report */
	p->policy_port = bpf_ntohs(p->dport);
	if (!hairpin)
		return LB_PASS;
	lb_hairpin_addr(p->family, hp);
	if (lb_rewrite(skb, p, hp, p->sport, 1))
		return LB_ERROR;
	return LB_HAIRPIN;
}

/* lb_hairpin_redirect sends a hairpin packet (the translated request, or
 * the backend's reply to the hairpin address) straight back into the
 * pod it came from: to the egress of the same host veth, where
 * to_container gives it its verdict and translation, with the MAC
 * addresses swapped (the pod addressed the host veth). identity (the
 * pod's, 0: none) goes in the mark for to_container's policy, as
 * from_overlay's does: the mark survives, the redirect stays in the
 * node's netns. */
static __noinline int lb_hairpin_redirect(struct __sk_buff *skb, __u32 identity)
{
	__u8 mac[12], swapped[12];

	if (bpf_skb_load_bytes(skb, 0, mac, 12))
		return TC_ACT_SHOT;
	__builtin_memcpy(swapped, &mac[6], 6);
	__builtin_memcpy(&swapped[6], mac, 6);
	if (bpf_skb_store_bytes(skb, 0, swapped, 12, 0))
		return TC_ACT_SHOT;
	skb->mark = identity ? MARK_IDENTITY_MAGIC | (identity << 8) : 0;
	return bpf_redirect(skb->ifindex, 0);
}

/* lb_nodeport_reply reports a backend's reply to a NodePort client from
 * outside (an lb_revnat entry flagged LB_REVNAT_NODEPORT): a lookup
 * only, the translation is nodeport_reply's. */
static __always_inline int lb_nodeport_reply(struct pkt *p)
{
	struct lb_tuple t = { .sport = p->sport, .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_revnat_value *rv;

	if (p->frag || !lb_proto_ok(p->proto))
		return 0;
	__builtin_memcpy(t.saddr, p->saddr, 16);
	__builtin_memcpy(t.daddr, p->daddr, 16);
	rv = bpf_map_lookup_elem(&lb_revnat, &t);
	return rv && rv->flags == LB_REVNAT_NODEPORT;
}

/* lb_reverse gives a reply from a backend the frontend's address and
 * port as its source (the client connected to the frontend), for the
 * revnat entries whose flags are want. Returns 1 if it did, 0 if the
 * packet is no such reply, -1 on error. */
static __noinline int lb_reverse(struct __sk_buff *skb, struct pkt *p, __u16 want)
{
	struct lb_tuple t = { .sport = p->sport, .dport = p->dport, .proto = p->proto, .family = p->family };
	struct lb_revnat_value *rv;
	__u32 addr[4], client[4];
	__u16 port, flags;

	if (p->frag || !lb_proto_ok(p->proto))
		return 0;
	__builtin_memcpy(t.saddr, p->saddr, 16);
	__builtin_memcpy(t.daddr, p->daddr, 16);
	rv = bpf_map_lookup_elem(&lb_revnat, &t);
	if (!rv)
		return 0;
	flags = rv->flags;
	/* A hairpin reply is translated where a client's reply is. */
	if ((flags == LB_REVNAT_NODEPORT) != (want == LB_REVNAT_NODEPORT))
		return 0;
	__builtin_memcpy(addr, rv->addr, 16);
	port = rv->port;
	__builtin_memcpy(client, p->saddr, 16);
	if (lb_rewrite(skb, p, addr, port, 1))
		return -1;
	if (flags == LB_REVNAT_HAIRPIN && lb_rewrite(skb, p, client, p->dport, 0))
		return -1;
	return 1;
}

/* lb_icmp_inner is the transport tuple an ICMP error quotes and where
 * its parts are. */
struct lb_icmp_inner {
	struct lb_tuple t; /* the quoted packet's, as the pod sent it */
	__u32 ip_off;      /* the quoted IP header */
	__u32 l4_off;      /* the quoted transport header */
};

/* lb_icmp_parse reads the packet an ICMP error p quotes; 0 if it is a
 * TCP or UDP packet of p's family whose ports are there. */
static __always_inline int lb_icmp_parse(struct __sk_buff *skb, struct pkt *p, struct lb_icmp_inner *in)
{
	__u8 hdr[40];
	__u16 ports[2];

	in->ip_off = p->l4off + 8;
	in->t.family = p->family;
	if (p->family == 4) {
		if (bpf_skb_load_bytes(skb, in->ip_off, hdr, 20))
			return -1;
		if ((hdr[0] >> 4) != 4 || (hdr[0] & 0xf) < 5 || (hdr[6] & 0x1f) || hdr[7])
			return -1; /* not IPv4, or a non-first fragment */
		in->t.proto = hdr[9];
		__builtin_memcpy(&in->t.saddr[0], &hdr[12], 4);
		__builtin_memcpy(&in->t.daddr[0], &hdr[16], 4);
		in->l4_off = in->ip_off + (hdr[0] & 0xf) * 4;
	} else {
		if (bpf_skb_load_bytes(skb, in->ip_off, hdr, 40))
			return -1;
		if ((hdr[0] >> 4) != 6)
			return -1;
		in->t.proto = hdr[6]; /* no extension headers */
		__builtin_memcpy(in->t.saddr, &hdr[8], 16);
		__builtin_memcpy(in->t.daddr, &hdr[24], 16);
		in->l4_off = in->ip_off + 40;
	}
	if (!lb_proto_ok(in->t.proto) || bpf_skb_load_bytes(skb, in->l4_off, ports, 4))
		return -1;
	in->t.sport = ports[0];
	in->t.dport = ports[1];
	return 0;
}

/* lb_icmp_rewrite gives the quoted packet of an ICMP error the frontend
 * rv as destination (and the error itself as source when the backend
 * sent it), keeping the quoted IPv4 checksum and the ICMP checksum. */
static __always_inline int lb_icmp_rewrite(struct __sk_buff *skb, struct pkt *p, struct lb_icmp_inner *in,
					   __u32 *fe, __u16 feport)
{
	__u32 csum_off = p->l4off + 2;
	__u16 old_ipsum, new_ipsum;
	__s64 diff;

	if (p->family == 4) {
		if (bpf_skb_load_bytes(skb, in->ip_off + 10, &old_ipsum, 2) ||
		    bpf_l3_csum_replace(skb, in->ip_off + 10, in->t.daddr[0], fe[0], 4) ||
		    bpf_skb_load_bytes(skb, in->ip_off + 10, &new_ipsum, 2) ||
		    bpf_l4_csum_replace(skb, csum_off, old_ipsum, new_ipsum, 2) ||
		    bpf_l4_csum_replace(skb, csum_off, in->t.daddr[0], fe[0], 4) ||
		    bpf_skb_store_bytes(skb, in->ip_off + 16, fe, 4, 0))
			return -1;
		if (p->saddr[0] == in->t.daddr[0] &&
		    (bpf_l3_csum_replace(skb, IP4_CSUM_OFF, p->saddr[0], fe[0], 4) ||
		     bpf_skb_store_bytes(skb, IP4_SADDR_OFF, fe, 4, 0)))
			return -1;
	} else {
		diff = bpf_csum_diff(in->t.daddr, 16, fe, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, csum_off, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, in->ip_off + 24, fe, 16, 0))
			return -1;
		/* ICMPv6's checksum covers the outer addresses too. */
		if (lb_addr_eq(p->saddr, in->t.daddr) &&
		    (bpf_l4_csum_replace(skb, csum_off, 0, diff, BPF_F_PSEUDO_HDR) ||
		     bpf_skb_store_bytes(skb, IP6_SADDR_OFF, fe, 16, 0)))
			return -1;
	}
	if (feport != in->t.dport &&
	    (bpf_l4_csum_replace(skb, csum_off, in->t.dport, feport, 2) ||
	     bpf_skb_store_bytes(skb, in->l4_off + 2, &feport, 2, 0)))
		return -1;
	return 0;
}

/* lb_ct_live reports whether the endpoint's conntrack holds k, fresh:
 * 0 if not, else CT_HIT | its flags (ct_reverse). */
static __always_inline int lb_ct_live(struct ct_key *k, __u64 now)
{
	struct ct_value *v = bpf_map_lookup_elem(&ct, k);

	if (!v || older_than(v->last_seen, now, ct_lifetime(k->proto)))
		return 0;
	return CT_HIT | v->flags;
}

/* lb_icmp_related handles an ICMP error p in direction dir of the
 * endpoint: it is related (Cilium's CT_RELATED) if it quotes a packet of
 * one of the endpoint's connections, which travelled the other way: a
 * conntrack entry of direction dir^1 with the quoted tuple (the pod
 * opened it to_container, the peer from_container), or one of dir with
 * the tuple reversed. Returns 1 for a related error, after giving the
 * quoted packet of a translated connection of the pod its frontend back
 * (to_container: the conntrack entry has the tuple as translated, to the
 * backend, and says it was translated: ct_reverse); 0: not related; -1:
 * a rewrite failed. */
static __noinline int lb_icmp_related(struct __sk_buff *skb, struct pkt *p, __u64 now, __u8 dir)
{
	struct lb_icmp_inner in = {};
	struct ct_key ck = { .ep = p->ep, .dir = dir ^ 1, .family = p->family };
	struct lb_tuple rt = {};
	struct lb_revnat_value *rv;
	__u32 fe[4];
	__u16 feport;
	int live;

	if (lb_icmp_parse(skb, p, &in))
		return 0;
	ck.proto = in.t.proto;
	ck.sport = in.t.sport;
	ck.dport = in.t.dport;
	__builtin_memcpy(ck.saddr, in.t.saddr, 16);
	__builtin_memcpy(ck.daddr, in.t.daddr, 16);
	live = lb_ct_live(&ck, now);
	if (!live) {
		ck.dir = dir;
		ck.sport = in.t.dport;
		ck.dport = in.t.sport;
		__builtin_memcpy(ck.saddr, in.t.daddr, 16);
		__builtin_memcpy(ck.daddr, in.t.saddr, 16);
		return !!lb_ct_live(&ck, now);
	}
	if (dir != DIR_INGRESS || !ct_reverse(live, CT_F_SVC))
		return 1;
	rt.family = p->family;
	rt.proto = in.t.proto;
	rt.sport = in.t.dport;
	rt.dport = in.t.sport;
	__builtin_memcpy(rt.saddr, in.t.daddr, 16);
	__builtin_memcpy(rt.daddr, in.t.saddr, 16);
	rv = bpf_map_lookup_elem(&lb_revnat, &rt);
	if (!rv || rv->flags != 0)
		return 1;
	__builtin_memcpy(fe, rv->addr, 16);
	feport = rv->port;
	return lb_icmp_rewrite(skb, p, &in, fe, feport) ? -1 : 1;
}

#include "nodeport.h"

#endif /* LB_MAPS_ONLY */
#endif /* __BPF__ */
#endif
