//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Socket-level service translation (the kube-proxy-free mode), as
 * Cilium's socket LB: cgroup programs attached to the agent's cgroup
 * (the cgroup2 root on a node) give a socket that connects or sends to
 * a service frontend one of its backends before any packet exists:
 *
 *   sock_connect4/6      connect(): TCP, and connected UDP
 *   sock_sendmsg4/6      sendmsg()/sendto() of unconnected UDP
 *   sock_recvmsg4/6      recvmsg(): a datagram from the backend is
 *                        reported as from the frontend
 *   sock_getpeername4/6  getpeername(): the frontend, not the backend
 *
 * Host processes are what needs it (no BPF program sees their packets
 * before the stack routes them); a pod's socket in the cgroup is given
 * the backend too, and its from-container program then sees a packet to
 * the backend, which is no frontend: nothing is translated twice.
 * connect() draws the backend at random among the frontend's slots, an
 * unconnected UDP socket's sendmsg() by its cookie (ClientIP
 * affinity: the one the network namespace used last, keyed by its
 * cookie); no backend fails connect()/sendmsg() with EPERM. A dual-stack
 * IPv6 socket reaching an IPv4-mapped address is translated as IPv4.
 * lb_sock (socket cookie, backend) -> frontend serves the reverse.
 * The lookups use a frontend's internal scope (LB_SCOPE_INTERNAL, the
 * zeroed key's): an externalTrafficPolicy Local NodePort reached from
 * the node or a pod gets any backend, as kube-proxy's short-circuit.
 */
#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "endpoint.h"
#define LB_MAPS_ONLY
#include "lb.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define SOCK_PASS 1
#define SOCK_REJECT 0

/* host_netns_cookie is the node's network namespace cookie, set when the
 * agent loads the programs: LB_FLAG_HOSTNS frontends apply there only. */
volatile const __u64 host_netns_cookie;

/* sock_pick returns the backend for a socket of netns cookie ns to
 * frontend fk (slot seed % count + 1 without affinity): NULL if fk is no
 * frontend; *reject if it has none. */
static __always_inline struct lb_backend *sock_pick(struct lb_key *fk, __u64 ns, __u32 seed, int *reject)
{
	struct lb_affinity_key ak = { .family = 0 };
	struct lb_slot_key sk = {};
	struct lb_affinity_value *av;
	struct lb_service *svc;
	struct lb_backend *b;
	__u64 now;

	svc = bpf_map_lookup_elem(&lb_frontends, fk);
	if (!svc)
		return NULL;
	if ((svc->flags & LB_FLAG_HOSTNS) && ns != host_netns_cookie)
		return NULL;
	if (svc->count == 0) {
		*reject = 1;
		return NULL;
	}
	sk.id = svc->id;
	ak.id = svc->id;
	__builtin_memcpy(ak.client, &ns, 8);
	now = bpf_ktime_get_ns();
	if (svc->flags & LB_FLAG_AFFINITY) {
		av = bpf_map_lookup_elem(&lb_affinity, &ak);
		/* A last_used another CPU wrote after this one read now is
		 * recent (endpoint.c's older_than). */
		if (av && (now <= av->last_used || now - av->last_used < (__u64)svc->affinity * 1000000000ULL) &&
		    av->slot <= svc->count) {
			sk.slot = av->slot;
			b = bpf_map_lookup_elem(&lb_backends, &sk);
			if (b && b->port == av->backend.port && b->addr[0] == av->backend.addr[0] &&
			    b->addr[1] == av->backend.addr[1] && b->addr[2] == av->backend.addr[2] &&
			    b->addr[3] == av->backend.addr[3]) {
				av->last_used = now;
				return b;
			}
		}
	}
	sk.slot = seed % svc->count + 1;
	b = bpf_map_lookup_elem(&lb_backends, &sk);
	if (!b) {
		*reject = 1;
		return NULL;
	}
	if (svc->flags & LB_FLAG_AFFINITY) {
		struct lb_affinity_value nv = { .last_used = now, .backend = *b, .slot = sk.slot };

		bpf_map_update_elem(&lb_affinity, &ak, &nv, BPF_ANY);
	}
	return b;
}

/* sock_record remembers that socket cookie was given backend b for fk. */
static __always_inline void sock_record(__u64 cookie, struct lb_backend *b, struct lb_key *fk)
{
	struct lb_sock_key k = { .cookie = cookie, .port = b->port, .family = fk->family };
	struct lb_sock_value v = { .port = fk->dport };

	__builtin_memcpy(k.addr, b->addr, 16);
	__builtin_memcpy(v.addr, fk->addr, 16);
	bpf_map_update_elem(&lb_sock, &k, &v, BPF_ANY);
}

static __always_inline int sock_proto_ok(__u32 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP;
}

/* sock_seed: connect() draws at random; sendmsg() (unconnected UDP)
 * hashes the socket's cookie, so one socket's datagrams keep going to one
 * backend while the backends stay the same. */
static __always_inline __u32 sock_seed(struct bpf_sock_addr *ctx, int send)
{
	__u64 c;

	if (!send)
		return bpf_get_prandom_u32();
	c = bpf_get_socket_cookie(ctx) * 0x9e3779b97f4a7c15ULL;
	return (__u32)(c >> 32);
}

static __always_inline int sock4_xlate(struct bpf_sock_addr *ctx, int send)
{
	struct lb_key fk = { .family = 4 };
	struct lb_backend *b;
	int reject = 0;

	if (!sock_proto_ok(ctx->protocol))
		return SOCK_PASS;
	fk.proto = ctx->protocol;
	fk.dport = (__u16)ctx->user_port;
	fk.addr[0] = ctx->user_ip4;
	b = sock_pick(&fk, bpf_get_netns_cookie(ctx), sock_seed(ctx, send), &reject);
	if (!b)
		return reject ? SOCK_REJECT : SOCK_PASS;
	ctx->user_ip4 = b->addr[0];
	ctx->user_port = b->port;
	sock_record(bpf_get_socket_cookie(ctx), b, &fk);
	return SOCK_PASS;
}

/* sock6_mapped reports an IPv4-mapped address (a dual-stack socket
 * reaching IPv4): translated as IPv4, keeping the mapping. */
static __always_inline int sock6_mapped(struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 && ctx->user_ip6[2] == bpf_htonl(0xffff);
}

static __always_inline int sock6_xlate(struct bpf_sock_addr *ctx, int send)
{
	struct lb_key fk = { .family = 6 };
	struct lb_backend *b;
	int reject = 0, mapped;

	if (!sock_proto_ok(ctx->protocol))
		return SOCK_PASS;
	mapped = sock6_mapped(ctx);
	fk.proto = ctx->protocol;
	fk.dport = (__u16)ctx->user_port;
	if (mapped) {
		fk.family = 4;
		fk.addr[0] = ctx->user_ip6[3];
	} else {
		fk.addr[0] = ctx->user_ip6[0];
		fk.addr[1] = ctx->user_ip6[1];
		fk.addr[2] = ctx->user_ip6[2];
		fk.addr[3] = ctx->user_ip6[3];
	}
	b = sock_pick(&fk, bpf_get_netns_cookie(ctx), sock_seed(ctx, send), &reject);
	if (!b)
		return reject ? SOCK_REJECT : SOCK_PASS;
	if (mapped) {
		ctx->user_ip6[3] = b->addr[0];
	} else {
		ctx->user_ip6[0] = b->addr[0];
		ctx->user_ip6[1] = b->addr[1];
		ctx->user_ip6[2] = b->addr[2];
		ctx->user_ip6[3] = b->addr[3];
	}
	ctx->user_port = b->port;
	sock_record(bpf_get_socket_cookie(ctx), b, &fk);
	return SOCK_PASS;
}

/* sock4_reverse reports a translated socket's backend as the frontend. */
static __always_inline int sock4_reverse(struct bpf_sock_addr *ctx)
{
	struct lb_sock_key k = { .cookie = bpf_get_socket_cookie(ctx), .family = 4 };
	struct lb_sock_value *v;

	k.port = (__u16)ctx->user_port;
	k.addr[0] = ctx->user_ip4;
	v = bpf_map_lookup_elem(&lb_sock, &k);
	if (v) {
		ctx->user_ip4 = v->addr[0];
		ctx->user_port = v->port;
	}
	return SOCK_PASS;
}

static __always_inline int sock6_reverse(struct bpf_sock_addr *ctx)
{
	struct lb_sock_key k = { .cookie = bpf_get_socket_cookie(ctx), .family = 6 };
	struct lb_sock_value *v;
	int mapped = sock6_mapped(ctx);

	k.port = (__u16)ctx->user_port;
	if (mapped) {
		k.family = 4;
		k.addr[0] = ctx->user_ip6[3];
	} else {
		k.addr[0] = ctx->user_ip6[0];
		k.addr[1] = ctx->user_ip6[1];
		k.addr[2] = ctx->user_ip6[2];
		k.addr[3] = ctx->user_ip6[3];
	}
	v = bpf_map_lookup_elem(&lb_sock, &k);
	if (!v)
		return SOCK_PASS;
	if (mapped) {
		ctx->user_ip6[3] = v->addr[0];
	} else {
		ctx->user_ip6[0] = v->addr[0];
		ctx->user_ip6[1] = v->addr[1];
		ctx->user_ip6[2] = v->addr[2];
		ctx->user_ip6[3] = v->addr[3];
	}
	ctx->user_port = v->port;
	return SOCK_PASS;
}

SEC("cgroup/connect4")
int sock_connect4(struct bpf_sock_addr *ctx) { return sock4_xlate(ctx, 0); }

SEC("cgroup/sendmsg4")
int sock_sendmsg4(struct bpf_sock_addr *ctx) { return sock4_xlate(ctx, 1); }

SEC("cgroup/recvmsg4")
int sock_recvmsg4(struct bpf_sock_addr *ctx) { return sock4_reverse(ctx); }

SEC("cgroup/getpeername4")
int sock_getpeername4(struct bpf_sock_addr *ctx) { return sock4_reverse(ctx); }

SEC("cgroup/connect6")
int sock_connect6(struct bpf_sock_addr *ctx) { return sock6_xlate(ctx, 0); }

SEC("cgroup/sendmsg6")
int sock_sendmsg6(struct bpf_sock_addr *ctx) { return sock6_xlate(ctx, 1); }

SEC("cgroup/recvmsg6")
int sock_recvmsg6(struct bpf_sock_addr *ctx) { return sock6_reverse(ctx); }

SEC("cgroup/getpeername6")
int sock_getpeername6(struct bpf_sock_addr *ctx) { return sock6_reverse(ctx); }
