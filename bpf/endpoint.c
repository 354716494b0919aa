//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Membrane's endpoint programs. One object, its endpoint programs loaded
 * ONCE PER NODE and attached to every endpoint's host veth:
 *
 *   from_container  ingress of the host veth: the pod's egress
 *   to_container    egress of the host veth: the pod's ingress
 *   from_netdev     TCX ingress of the node's uplinks (kube-proxy-free
 *                   mode and host firewall; loaded once per node,
 *                   nodeport.h, hostfw.h)
 *   to_netdev       TCX egress of the node's uplinks (host firewall,
 *                   hostfw.h)
 *   nodeport_reply  tail-called by from_container for a local backend's
 *                   reply to a NodePort client (loaded with from_netdev)
 *
 * Whose packet: the endpoint is looked up in the per-node endpoints map
 * by skb->ifindex, the host veth's ifindex at TC ingress and egress alike
 * (also for a packet to_container hairpins to the L7 proxy: it re-enters
 * the ingress of the same veth). Its value gives the endpoint ID (the
 * conntrack and drop-counter key, the drop events' endpoint), its
 * identity (the drop events') and its slot, the key of the outer maps
 * policy_maps and cidr_maps, whose values are the endpoint's own policy
 * LPM tries, pinned at <bpffs>/endpoints/<id>/. The slot and not the ID
 * keys them because every user-space write to a map of maps waits for an
 * RCU grace period (~12 ms): the agent fills slots (empty tries in the
 * outer maps) ahead of time. A CNI ADD therefore loads nothing and waits
 * for no grace period: user space takes a filled slot, pins its tries
 * under the endpoint's directory, writes the policy and the ifindex entry,
 * and attaches the node's programs (datapath/).
 *
 * An interface without an endpoints entry (or whose endpoint lacks either
 * policy map) drops every frame, ARP included, with DROP_NO_ENDPOINT,
 * counted and reported under endpoint 0: nothing says which policy
 * applies, so fail closed. The agent writes the entries before it
 * attaches and detaches cls_bpf filters before it deletes them; between
 * a Remove and the deferred close of a TCX link the pod's last packets
 * are dropped this way. nodeport_reply runs after from_container's
 * verdict and counts its drops under endpoint 0, as before.
 *
 * Verdict for an IP packet, in direction dir of endpoint ep:
 *   1. a reply of a connection ep saw first in the other direction
 *      (conntrack hit on the reversed tuple) passes;
 *   2. if dir is enforced (policy map entry {ENFORCE, dir, 0, 0}; not
 *      looked up when the endpoint's entry says dir is not,
 *      ENDPOINT_F_ENFORCE_KNOWN), the
 *      first policy entry found in policy.Lookups order (exact, port
 *      wildcard, L3-only, then the same with peer 0 = any) decides if it
 *      denies (DROP_POLICY_DENY), and so does a CIDR deny group holding
 *      the peer's address; else the packet needs that policy entry
 *      (allowing) or an allowing CIDR entry for the peer's address
 *      (cidr_match: CIDR rules decide on the address whatever its
 *      identity, so a pod's address is matched too); else drop;
 *   3. a passing packet records its connection in conntrack (ep, dir,
 *      tuple) so that the replies pass step 1.
 * Before step 1, a packet the pod sends to a service frontend is
 * translated to a backend (lb.h), so every step sees the backend; a
 * reply from it gets the frontend back as its source after step 3, if
 * step 1 found it a reply of a connection step 3 recorded as translated
 * (ct_value.flags). A
 * hairpin (the backend is the pod itself) also gets the hairpin address
 * as source and, after step 3, goes straight back into the pod through
 * to_container, with the pod's identity as the peer's (lb.h).
 * Step 2 runs for every packet of the original direction, not only the
 * first: a policy change applies to established connections at once.
 * Between the pod and a host address (the host firewall's host endpoint,
 * hostfw.h's host_local) the host's policy decides too: its egress
 * policy before step 2 of to_container, its ingress policy after step 2
 * of from_container, each recording the host's side of the connection
 * under endpoint 0.
 *
 * L7 redirect: when the entry that allows a packet carries a proxy port
 * (policy_value.proxy_port), the packet goes to the proxy's transparent
 * socket in the node's netns instead of its destination, which it keeps
 * (the proxy reads it as the accepted socket's local address):
 *   - from_container (TC ingress: bpf_sk_assign works there) assigns it
 *     to the socket (proxy_assign) and marks it MARK_TO_PROXY_MAGIC, which
 *     the datapath's ip rule routes to the local table;
 *   - to_container runs at TC egress, where bpf_sk_assign cannot, so it
 *     marks the packet and redirects it to the ingress of the same host
 *     veth (proxy_hairpin): from_container then sees the mark and assigns
 *     it without a second verdict (Cilium's ctx_redirect_to_proxy_hairpin
 *     does the same through cilium_host).
 * The proxy's replies come from the original destination address (an
 * IP_TRANSPARENT socket) and pass as conntrack replies of the recorded
 * connection. Its upstream connections carry MARK_PROXY_MAGIC and the
 * client's identity in the mark: the peer's verdict uses that identity and
 * never redirects them again. The upstream connection of a local client
 * (an egress redirect) also keeps the client's address (IP_TRANSPARENT),
 * so that a peer on another node sees the client's identity too (its
 * ipcache, or the VNI to_overlay derives from the address); the answers
 * reach the client's to_container, which finds the proxy's socket by
 * their tuple and hairpins them to it (proxy_upstream). Packets of
 * entries without a proxy port are untouched.
 *
 * Decisions (tested in datapath/bpf_prog_linux_test.go; the source check
 * in bpf_source_prog_linux_test.go and bpf_spoof_e2e_linux_test.go):
 *   - What the pod sends (from_container) must come from its own
 *     address, checked right after its ethertype (l3_ok, below) and
 *     before anything else (source_ok): an IP packet
 *     from another source, of a family the endpoint has no address of,
 *     or an ARP frame with another sender address is dropped with
 *     DROP_INVALID_SOURCE. Essential ICMPv6 from a link-local source or
 *     from :: is exempt (neighbour discovery). Packets to_container
 *     hairpins to the proxy are traffic to the pod and are not checked.
 *   - From the pod, only untagged IPv4, IPv6 and ARP frames pass the
 *     first check (l3_ok): every other ethertype, and any frame with a
 *     VLAN tag, is dropped with DROP_UNKNOWN_L3 whether or not egress is
 *     enforced. The verdict must be about the packet the kernel delivers:
 *     the host veth's receive path pulls a VLAN tag into skb metadata
 *     before TC and, after TC, strips priority tags (VID 0) one after the
 *     other, so a QinQ frame with two such tags shows TC an 802.1Q
 *     ethertype yet reaches the IP stack as the IPv4 packet it carries,
 *     with whatever source it names. Pods have no business sending VLAN
 *     tags, LLDP, 802.3 length-field frames, MPLS or PPPoE: a pod that
 *     needs another L2 protocol needs another network attachment.
 *   - ARP passes (from the pod: with its IPv4 sender address). To the
 *     pod, non-IP frames pass unless ingress is enforced (then
 *     DROP_UNKNOWN_L3): the node sends them, not a peer.
 *   - In tunnel mode, UDP from the pod to the node's tunnel port
 *     (node_config.tunnel_port; after service translation, any
 *     destination) is dropped with DROP_TUNNEL_PORT: the receiving
 *     node's overlay program takes the VNI as the source identity, and a
 *     pod must not choose its own (Cilium, CVE-2019-13119). Pods cannot
 *     use that UDP port to reach anything, in the cluster or outside.
 *   - Non-first fragments (IPv4 offset != 0, IPv6 fragment header offset
 *     != 0) carry no ports: they are looked up with port 0, so only
 *     L3-only or protocol-wide (port wildcard) entries allow them;
 *     otherwise DROP_FRAGMENT. They neither match nor create conntrack
 *     entries. First fragments are ordinary packets.
 *   - Truncated/unparseable IP headers pass unless dir is enforced (the
 *     kernel's own stack drops them), then DROP_MALFORMED.
 *   - Essential ICMPv6 always passes (RFC 4890 4.3.1/4.4.1): destination
 *     unreachable, packet too big, time exceeded, parameter problem
 *     (types 1-4), multicast listener discovery (130-132, 143) and
 *     neighbour discovery (133-137). ICMP and ICMPv6 echo use the echo
 *     identifier as both conntrack ports and port 0 in policy. An ICMP or
 *     ICMPv6 error quoting a packet of one of the endpoint's connections
 *     is related and passes (lb.h's lb_icmp_related: a Service flow's gets
 *     its frontend back); other ICMP is policy-checked like new traffic.
 *   - IPv6 extension headers: up to 4 of hop-by-hop, routing, fragment,
 *     destination options, AH; more is malformed.
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

#define IPV6_MAX_EXT 4
#define ETH_HLEN_ 14

/* Shared, pinned at <bpffs>/ipcache: address/prefix -> identity. */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__type(key, struct ipcache_key);
	__type(value, struct ipcache_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} ipcache SEC(".maps");

/* Shared, pinned at <bpffs>/endpoints_by_ifindex: the host veth's ifindex (in
 * the node's netns) -> the endpoint on it (struct endpoint_info). The
 * programs are loaded once per node; this map, not a program constant,
 * says whose packet it is. Sized like the endpoint IDs (uint16). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, struct endpoint_info);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} endpoints SEC(".maps");

/* Per endpoint, pinned at <bpffs>/endpoints/<id>/policy and reached
 * through the shared outer map policy_maps (<bpffs>/policy_maps, keyed
 * by the endpoint's slot, struct endpoint_info). An LPM trie and not a hash: a BPF_F_NO_PREALLOC hash
 * still allocates its bucket array up front (16 bytes x max_entries
 * rounded up to a power of two: 256 KiB at 16384 entries), a trie only
 * its entries (about 2 KiB for 20). It also resolves the three wildcard
 * levels of one peer in one lookup. Every inner map has this template's
 * type, key and value sizes, flags and max_entries (the kernel checks). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);
		__type(key, struct policy_key);
		__type(value, struct policy_value);
		__uint(max_entries, 16384);
		__uint(map_flags, BPF_F_NO_PREALLOC);
	});
} policy_maps SEC(".maps");

/* Per endpoint, pinned at <bpffs>/endpoints/<id>/cidr and reached
 * through cidr_maps (<bpffs>/cidr_maps): the CIDR rules
 * (policy.CIDREntry), evaluated on the peer's address. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__type(key, __u32);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_LPM_TRIE);
		__type(key, struct cidr_key);
		__type(value, struct cidr_value);
		__uint(max_entries, 16384);
		__uint(map_flags, BPF_F_NO_PREALLOC);
	});
} cidr_maps SEC(".maps");

/* Shared, pinned at <bpffs>/ct. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
	__uint(max_entries, 65536);
} ct SEC(".maps");

/* Shared, pinned at <bpffs>/drops: drop counters by endpoint, reason, dir. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct drop_key);
	__type(value, struct drop_value);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} drops SEC(".maps");

/* Shared, pinned at <bpffs>/events: drop notifications. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/* Shared, pinned at <bpffs>/flows: flow reports (struct flow_event), one
 * per new connection (flow_report). A ring of its own: a flood of new
 * connections never crowds out the drop notifications, nor the reverse. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} flows SEC(".maps");

/* Shared, pinned at <bpffs>/flow_config: one entry (key 0), whether flows
 * are reported (struct flow_config_value), written by the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_config_value);
	__uint(max_entries, 1);
} flow_config SEC(".maps");

/* Shared, pinned at <bpffs>/flow_stats: per-CPU counters of flows
 * reported and of flow and drop notifications lost to a full ring. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct flow_stats_value);
	__uint(max_entries, 1);
} flow_stats SEC(".maps");

/* Shared, pinned at <bpffs>/node_config: one entry (key 0), the node's
 * settings (struct node_config_value), written by the datapath when they
 * change, read by every program on every packet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct node_config_value);
	__uint(max_entries, 1);
} node_config SEC(".maps");

#define AF_INET_ 2
#define AF_INET6_ 10

#include "forward.h"

/* Anchors for bpf2go -type: types only user space reads need BTF. */
const struct drop_event *const unused_drop_event __attribute__((unused)) = 0;
const enum drop_reason *const unused_drop_reason __attribute__((unused)) = 0;
const struct node_config_value *const unused_node_config_value __attribute__((unused)) = 0;
const struct host_safe_key *const unused_host_safe_key __attribute__((unused)) = 0;
const struct flow_event *const unused_flow_event __attribute__((unused)) = 0;
const struct flow_config_value *const unused_flow_config_value __attribute__((unused)) = 0;
const struct flow_stats_value *const unused_flow_stats_value __attribute__((unused)) = 0;
/* The inner map templates' key and value types (else clang emits them as
 * forward declarations, which the loader cannot size). */
const struct policy_key *const unused_policy_key __attribute__((unused)) = 0;
const struct policy_value *const unused_policy_value __attribute__((unused)) = 0;
const struct cidr_key *const unused_cidr_key __attribute__((unused)) = 0;
const struct cidr_value *const unused_cidr_value __attribute__((unused)) = 0;

struct pkt {
	__u8 family; /* 0 non-IP, 4, 6 */
	__u8 proto;
	__u8 frag; /* non-first fragment */
	__u8 ndp;  /* essential ICMPv6: neighbour discovery, MLD, errors */
	__u8 icmp_err; /* an ICMP error quoting a packet (lb_icmp_related) */
	__u8 bits;     /* PKT_* (in the padding) */
	__u8 tcp_flags; /* TCP: the header's flags byte (0: not read) */
	__u8 frag4;     /* IPv4: any fragment, the first too (MF or an offset; local_deliver) */
	__u16 sport, dport; /* network order; ICMP echo id: dport of a request, sport of a reply */
	__u16 l3proto;      /* ethertype, host order */
	__u16 policy_port;  /* host order; TCP/UDP/SCTP port, 0x100|ICMP type, else 0 */
	__u16 l4off;        /* the transport header's offset (lb.h) */
	__u32 ep;           /* the endpoint's ID (endpoint_info; 0: none) */
	__u32 identity;     /* the endpoint's identity */
	__u32 saddr[4];
	__u32 daddr[4];
};

enum { PARSE_OK, PARSE_NOT_IP, PARSE_BAD };

/* pkt.bits: one byte for what would otherwise take a variable each in
 * handle (the stack of the longest call chain is close to 512 bytes). */
#define PKT_AUDIT 1    /* the endpoint's ENDPOINT_F_AUDIT */
#define PKT_SVC 2      /* lb_translate translated it to a backend (flow_report) */
#define PKT_ENFORCED 4 /* the direction is policy-enforced (flow_report) */
#define PKT_NODEPORT 8 /* from_netdev translated it for this pod (MARK_NODEPORT_MAGIC) */
#define PKT_DIRECT 16  /* a local pod's from_container delivered it (MARK_DIRECT_MAGIC) */
#define PKT_OPENS 32   /* from the pod: it begins a connection (opens_conn; CT_F_OPENED) */
#define PKT_UNENFORCED 64 /* the endpoint's flags say dir has no enforce entry (ENDPOINT_F_ENFORCE_KNOWN) */
#define PKT_UPLINK 128 /* netdev_deliver delivered it from an uplink (MARK_UPLINK_DIRECT_MAGIC) */

static __noinline int parse_l4(struct __sk_buff *skb, __u32 off, struct pkt *p)
{
	__u8 hdr[14];

	p->l4off = off;
	if (p->frag)
		return PARSE_OK;
	switch (p->proto) {
	case IPPROTO_TCP:
		/* The flags too, in the same load (a header cut short of
		 * them still parses, as before, without them). */
		if (!bpf_skb_load_bytes(skb, off, hdr, 14)) {
			p->tcp_flags = hdr[13];
			goto ports;
		}
		/* fallthrough */
	case IPPROTO_UDP:
	case IPPROTO_SCTP:
		if (bpf_skb_load_bytes(skb, off, hdr, 4))
			return PARSE_BAD;
	ports:
		__builtin_memcpy(&p->sport, &hdr[0], 2);
		__builtin_memcpy(&p->dport, &hdr[2], 2);
		p->policy_port = bpf_ntohs(p->dport);
		return PARSE_OK;
	case IPPROTO_ICMP:
	case IPPROTO_ICMPV6:
		if (bpf_skb_load_bytes(skb, off, hdr, 8))
			return PARSE_BAD;
		/* Policy matches the type (policy.ICMPTypePort). */
		p->policy_port = 0x100 | hdr[0];
		/* An echo request's id is its destination "port", a reply's
		 * its source (as in Cilium): a reply's reversed tuple is its
		 * request's, while a request the other way (same id, both
		 * ends pinging) is a flow of its own, judged by policy. */
		if ((p->proto == IPPROTO_ICMP && hdr[0] == 8) || (p->proto == IPPROTO_ICMPV6 && hdr[0] == 128))
			__builtin_memcpy(&p->dport, &hdr[4], 2);
		if ((p->proto == IPPROTO_ICMP && hdr[0] == 0) || (p->proto == IPPROTO_ICMPV6 && hdr[0] == 129))
			__builtin_memcpy(&p->sport, &hdr[4], 2);
		if (p->proto == IPPROTO_ICMPV6 &&
		    ((hdr[0] >= 1 && hdr[0] <= 4) || (hdr[0] >= 130 && hdr[0] <= 137) || hdr[0] == 143))
			p->ndp = 1;
		/* Destination unreachable, time exceeded, parameter problem
		 * (IPv4); ICMPv6 errors 1-4. */
		if ((p->proto == IPPROTO_ICMP && (hdr[0] == 3 || hdr[0] == 11 || hdr[0] == 12)) ||
		    (p->proto == IPPROTO_ICMPV6 && hdr[0] >= 1 && hdr[0] <= 4))
			p->icmp_err = 1;
		return PARSE_OK;
	}
	return PARSE_OK;
}

static __always_inline int parse_ipv4(struct __sk_buff *skb, struct pkt *p)
{
	struct iphdr ip;

	if (bpf_skb_load_bytes(skb, ETH_HLEN_, &ip, sizeof(ip)))
		return PARSE_BAD;
	if (ip.version != 4 || ip.ihl < 5)
		return PARSE_BAD;
	p->family = 4;
	p->proto = ip.protocol;
	p->saddr[0] = ip.saddr;
	p->daddr[0] = ip.daddr;
	if (bpf_ntohs(ip.frag_off) & 0x1fff)
		p->frag = 1;
	if (bpf_ntohs(ip.frag_off) & 0x3fff)
		p->frag4 = 1;
	return parse_l4(skb, ETH_HLEN_ + ip.ihl * 4, p);
}

static __always_inline int parse_ipv6(struct __sk_buff *skb, struct pkt *p)
{
	struct ipv6hdr ip6;
	__u32 off = ETH_HLEN_ + sizeof(ip6);
	__u8 nh, ext[4];
	int i;

	if (bpf_skb_load_bytes(skb, ETH_HLEN_, &ip6, sizeof(ip6)))
		return PARSE_BAD;
	if (ip6.version != 6)
		return PARSE_BAD;
	p->family = 6;
	__builtin_memcpy(p->saddr, &ip6.saddr, 16);
	__builtin_memcpy(p->daddr, &ip6.daddr, 16);
	nh = ip6.nexthdr;
#pragma unroll
	for (i = 0; i < IPV6_MAX_EXT; i++) {
		switch (nh) {
		case IPPROTO_HOPOPTS:
		case IPPROTO_ROUTING:
		case IPPROTO_DSTOPTS:
			if (bpf_skb_load_bytes(skb, off, ext, 2))
				return PARSE_BAD;
			nh = ext[0];
			off += (ext[1] + 1) * 8;
			break;
		case IPPROTO_AH:
			if (bpf_skb_load_bytes(skb, off, ext, 2))
				return PARSE_BAD;
			nh = ext[0];
			off += (ext[1] + 2) * 4;
			break;
		case IPPROTO_FRAGMENT:
			if (bpf_skb_load_bytes(skb, off, ext, 4))
				return PARSE_BAD;
			nh = ext[0];
			if (((ext[2] << 8) | ext[3]) & 0xfff8)
				p->frag = 1;
			off += 8;
			break;
		default:
			goto done;
		}
	}
	switch (nh) {
	case IPPROTO_HOPOPTS:
	case IPPROTO_ROUTING:
	case IPPROTO_DSTOPTS:
	case IPPROTO_AH:
	case IPPROTO_FRAGMENT:
		return PARSE_BAD; /* too many extension headers */
	}
done:
	p->proto = nh;
	return parse_l4(skb, off, p);
}

static __always_inline int parse(struct __sk_buff *skb, struct pkt *p)
{
	__be16 proto;

	if (bpf_skb_load_bytes(skb, 12, &proto, 2))
		return PARSE_NOT_IP; /* not even an Ethernet header */
	p->l3proto = bpf_ntohs(proto);
	switch (p->l3proto) {
	case ETH_P_IP:
		return parse_ipv4(skb, p);
	case ETH_P_IPV6:
		return parse_ipv6(skb, p);
	}
	return PARSE_NOT_IP;
}

/* enforce_entry reports whether policy holds the enforce entry of
 * direction dir. */
static __always_inline int enforce_entry(void *policy, __u8 dir)
{
	struct policy_key k = {
		.prefixlen = POLICY_PREFIX_FULL,
		.identity = POLICY_ENFORCE_IDENTITY,
		.dir = dir,
	};

	return bpf_map_lookup_elem(policy, &k) != NULL;
}

/* enforced reports whether direction dir of p's endpoint, whose policy
 * map is policy, is enforced: the map's enforce entry, not looked up
 * when the endpoint's flags say there is none (PKT_UNENFORCED). */
static __always_inline int enforced(void *policy, struct pkt *p, __u8 dir)
{
	return !(p->bits & PKT_UNENFORCED) && enforce_entry(policy, dir);
}

static __always_inline __u32 peer_identity(struct pkt *p, __u8 dir)
{
	struct ipcache_key k = { .family = p->family };
	struct ipcache_value *v;

	k.prefixlen = 32 + (p->family == 4 ? 32 : 128);
	if (dir == DIR_EGRESS)
		__builtin_memcpy(k.addr, p->daddr, 16);
	else
		__builtin_memcpy(k.addr, p->saddr, 16);
	v = bpf_map_lookup_elem(&ipcache, &k);
	return v ? v->identity : IDENTITY_WORLD;
}

/* tunnel_identity is the source identity a tunnel (overlay.c's
 * from_overlay) or the L7 proxy delivered for a packet entering the
 * endpoint in its mark, 0 if none: then the ipcache decides on the
 * source address. */
static __always_inline __u32 tunnel_identity(struct __sk_buff *skb, __u8 dir)
{
	__u32 magic = skb->mark & MARK_MAGIC_MASK;

	if (dir != DIR_INGRESS ||
	    (magic != MARK_IDENTITY_MAGIC && magic != MARK_IDENTITY_DIRECT_MAGIC && magic != MARK_PROXY_MAGIC))
		return 0;
	return skb->mark >> 8;
}

/* from_proxy reports whether the L7 proxy sent the packet. */
static __always_inline int from_proxy(struct __sk_buff *skb)
{
	return (skb->mark & MARK_MAGIC_MASK) == MARK_PROXY_MAGIC;
}

/* policy_lookup tries the peer's entries, then any peer's (identity 0):
 * the longest prefix is exact, then port wildcard, then L3-only, which is
 * policy.Lookups' order. */
static __always_inline struct policy_value *policy_lookup(void *policy, __u32 peer, struct pkt *p, __u8 dir)
{
	struct policy_key k = {
		.prefixlen = POLICY_PREFIX_FULL,
		.identity = peer,
		.dir = dir,
		.proto = p->proto,
		.dport = p->policy_port,
	};
	struct policy_value *v;

	v = bpf_map_lookup_elem(policy, &k);
	if (v)
		return v;
	k.identity = 0;
	return bpf_map_lookup_elem(policy, &k);
}

/* cidr_match reports whether the CIDR groups of kind dir (a direction,
 * with CIDR_DIR_DENY for the deny groups) hold the peer's address: the
 * longest match of the exact {proto, dport} group, else of the port
 * wildcard group, else of the any-protocol group has allow set
 * (policy.CIDRAllows, policy.CIDRDenies). It counts the packet on that
 * entry. Not inlined: its key would push the largest call chain's
 * stack past 512 bytes. */
static __noinline int cidr_match(void *cidr_policy, struct pkt *p, __u8 dir, __u32 len)
{
	struct cidr_key k = {
		.prefixlen = CIDR_PREFIX_BASE + (p->family == 4 ? 32 : 128),
		.dir = dir,
		.proto = p->proto,
		.dport = p->policy_port,
		.family = p->family,
	};
	struct cidr_value *v;

	if ((dir & ~CIDR_DIR_DENY) == DIR_EGRESS)
		__builtin_memcpy(k.addr, p->daddr, 16);
	else
		__builtin_memcpy(k.addr, p->saddr, 16);
	v = bpf_map_lookup_elem(cidr_policy, &k);
	if (v && v->allow)
		goto hit;
	k.dport = 0;
	v = bpf_map_lookup_elem(cidr_policy, &k);
	if (v && v->allow)
		goto hit;
	k.proto = 0;
	v = bpf_map_lookup_elem(cidr_policy, &k);
	if (v && v->allow)
		goto hit;
	return 0;
hit:
	__sync_fetch_and_add(&v->packets, 1);
	__sync_fetch_and_add(&v->bytes, len);
	return 1;
}

static __always_inline __u64 ct_lifetime(__u8 proto)
{
	return proto == IPPROTO_TCP ? CT_LIFETIME_TCP : CT_LIFETIME_OTHER;
}

/* older_than reports whether t (a bpf_ktime_get_ns stamp in a shared
 * map) lies more than age before now. Another CPU may have written a t
 * later than this CPU's now, which it read before: such a t is recent,
 * not (now - t wrapping around) ancient. Without this a connection whose
 * two directions run on two CPUs at once saw its conntrack entry
 * "expire" now and then: a reply taken for a new connection. */
static __always_inline int older_than(__u64 t, __u64 now, __u64 age)
{
	return now > t && now - t > age;
}

/* CT_HIT in what ct_is_reply returns: the packet is a reply; the low
 * bits are its entry's CT_F_* flags. */
#define CT_HIT 0x100
#define CT_NEW 0x200 /* ct_record created the entry */

/* ct_is_reply reports whether p is a reply of a connection the endpoint
 * saw first in the other direction, refreshing it: 0 if not, else
 * CT_HIT | the entry's flags (ct_reverse). */
static __noinline int ct_is_reply(struct pkt *p, __u8 dir, __u64 now)
{
	struct ct_key k = {
		.ep = p->ep,
		.dir = dir ^ 1,
		.family = p->family,
		.proto = p->proto,
		.sport = p->dport,
		.dport = p->sport,
	};
	struct ct_value *v;

	__builtin_memcpy(k.saddr, p->daddr, 16);
	__builtin_memcpy(k.daddr, p->saddr, 16);
	v = bpf_map_lookup_elem(&ct, &k);
	if (!v || older_than(v->last_seen, now, ct_lifetime(p->proto)))
		return 0;
	v->last_seen = now;
	__sync_fetch_and_add(&v->packets, 1);
	return CT_HIT | v->flags;
}

/* ct_reverse reports whether a packet whose conntrack answer is ct
 * (ct_is_reply's) gets the reverse translation want (CT_F_SVC,
 * CT_F_NODEPORT): only a reply, and only of a connection recorded as so
 * translated. An entry of an earlier build (no CT_F_KNOWN) leaves it to
 * lb_revnat alone, as that build did. */
static __always_inline int ct_reverse(int ct, __u32 want)
{
	if (!(ct & CT_HIT))
		return 0;
	if (!(ct & CT_F_KNOWN))
		return 1;
	return !!(ct & want);
}

/* ct_peer_opened reports whether p, which the pod sends, is a reply of
 * a connection the endpoint saw first arriving (its peer opened it),
 * without refreshing it: lb_translate leaves such a packet alone even
 * when its destination is a frontend's address and port (a host process
 * bound there, a masquerade with random ports reaching the pod). */
static __noinline int ct_peer_opened(struct pkt *p, __u64 now)
{
	struct ct_key k = {
		.ep = p->ep,
		.dir = DIR_INGRESS,
		.family = p->family,
		.proto = p->proto,
		.sport = p->dport,
		.dport = p->sport,
	};
	struct ct_value *v;

	__builtin_memcpy(k.saddr, p->daddr, 16);
	__builtin_memcpy(k.daddr, p->saddr, 16);
	v = bpf_map_lookup_elem(&ct, &k);
	return v && !older_than(v->last_seen, now, ct_lifetime(p->proto));
}

/* ct_flags are the CT_F_* flags the packet p of a connection's original
 * direction gives its entry. */
static __always_inline __u32 ct_flags(struct pkt *p)
{
	__u32 f = CT_F_KNOWN;

	if (p->bits & PKT_SVC)
		f |= CT_F_SVC;
	if (p->bits & PKT_NODEPORT)
		f |= CT_F_NODEPORT;
	if (p->bits & PKT_DIRECT)
		f |= CT_F_DIRECT;
	if (p->bits & PKT_OPENS)
		f |= CT_F_OPENED;
	if (p->bits & PKT_UPLINK)
		f |= CT_F_UPLINK;
	return f;
}

#define TCP_F_SYN 0x02
#define TCP_F_ACK 0x10

/* opens_conn reports whether p, which the pod sends, begins a
 * connection (CT_F_OPENED): a TCP SYN without ACK, or anything not TCP
 * (UDP, ICMP echo, SCTP: nothing tells their first packet from a later
 * one). */
static __always_inline int opens_conn(struct pkt *p)
{
	if (p->proto != IPPROTO_TCP)
		return 1;
	return (p->tcp_flags & (TCP_F_SYN | TCP_F_ACK)) == TCP_F_SYN;
}

/* ct_record creates or refreshes the connection of p in direction dir;
 * it returns CT_NEW when it created the entry (a new connection:
 * flow_report), or'ed with the entry's CT_F_OPENED (lb_out).
 * The entry's flags become p's (ct_flags): whether the replies are
 * reverse-translated follows the packets of the original direction;
 * CT_F_OPENED stays from the packet that created the entry (or a later
 * one that opens a connection with the same tuple).
 * Not inlined: the stack of the programs that call it stays within the
 * verifier's bound. */
static __noinline int ct_record(struct pkt *p, __u8 dir, __u64 now)
{
	struct ct_key k = {
		.ep = p->ep,
		.dir = dir,
		.family = p->family,
		.proto = p->proto,
		.sport = p->sport,
		.dport = p->dport,
	};
	struct ct_value nv = { .last_seen = now, .packets = 1, .flags = ct_flags(p) };
	struct ct_value *v;

	__builtin_memcpy(k.saddr, p->saddr, 16);
	__builtin_memcpy(k.daddr, p->daddr, 16);
	v = bpf_map_lookup_elem(&ct, &k);
	if (v) {
		v->last_seen = now;
		__sync_fetch_and_add(&v->packets, 1);
		/* An egress entry's CT_F_UPLINK is local_deliver's. */
		nv.flags |= v->flags & (dir == DIR_EGRESS ? CT_F_OPENED | CT_F_UPLINK : CT_F_OPENED);
		if (v->flags != nv.flags)
			v->flags = nv.flags;
		return nv.flags & CT_F_OPENED;
	}
	bpf_map_update_elem(&ct, &k, &nv, BPF_ANY);
	return CT_NEW | (nv.flags & CT_F_OPENED);
}

/* flow_lost counts a notification the ring had no room for. */
static __always_inline void flow_lost(int drop)
{
	__u32 zero = 0;
	struct flow_stats_value *s = bpf_map_lookup_elem(&flow_stats, &zero);

	if (!s)
		return;
	if (drop)
		s->drops_lost++;
	else
		s->flows_lost++;
}

static __noinline int drop(struct __sk_buff *skb, struct pkt *p, __u8 dir, __u8 reason, __u32 peer)
{
	struct drop_key k = { .ep = p->ep, .reason = reason, .dir = dir };
	struct drop_value zero = {}, *v;
	struct drop_event *e;
	__u8 tcp_flags = 0;

	v = bpf_map_lookup_elem(&drops, &k);
	if (!v) {
		bpf_map_update_elem(&drops, &k, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(&drops, &k);
	}
	if (v) {
		__sync_fetch_and_add(&v->packets, 1);
		__sync_fetch_and_add(&v->bytes, skb->len);
	}
	if (p->proto == IPPROTO_TCP && !p->frag)
		bpf_skb_load_bytes(skb, p->l4off + 13, &tcp_flags, 1);
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (e) {
		e->time_ns = bpf_ktime_get_ns();
		e->ep = p->ep;
		e->reason = reason;
		e->dir = dir;
		e->family = p->family;
		e->proto = p->proto;
		e->sport = bpf_ntohs(p->sport);
		e->dport = bpf_ntohs(p->dport);
		e->tcp_flags = tcp_flags;
		e->pad = 0;
		e->peer_identity = peer;
		e->identity = p->identity;
		e->len = skb->len;
		__builtin_memcpy(e->saddr, p->saddr, 16);
		__builtin_memcpy(e->daddr, p->daddr, 16);
		bpf_ringbuf_submit(e, 0);
	} else {
		flow_lost(1);
	}
	return TC_ACT_SHOT;
}

#include "lb.h"
#include "hostfw.h"

/* flow_report reports the first packet of a new connection of endpoint
 * p->ep in direction dir (ct_record created its entry) with its verdict:
 * how is FLOW_* | FLOW_F_* << 8 | proxy port << 16. peer 0 (a direction
 * not enforced: no lookup was made) is looked up here. A Service
 * translation's frontend comes from the reverse translation lb_translate
 * recorded (lb_revnat, keyed by the reply's tuple) when it translated
 * p (PKT_SVC). Only new connections
 * pay for it, and nothing when flow_config is off. */
static __noinline int flow_report(struct __sk_buff *skb, struct pkt *p, __u8 dir, __u32 how, __u32 peer)
{
	__u32 zero = 0;
	struct flow_config_value *c = bpf_map_lookup_elem(&flow_config, &zero);
	struct flow_stats_value *s;
	struct lb_revnat_value *rv;
	struct lb_tuple t = {};
	struct flow_event *e;
	__u8 tcp_flags = 0;

	if (!c || !(c->flags & FLOW_CONFIG_ON))
		return 0;
	if (!peer)
		peer = tunnel_identity(skb, dir) ?: peer_identity(p, dir);
	if (p->proto == IPPROTO_TCP && !p->frag)
		bpf_skb_load_bytes(skb, p->l4off + 13, &tcp_flags, 1);
	e = bpf_ringbuf_reserve(&flows, sizeof(*e), 0);
	if (!e) {
		flow_lost(0);
		return 0;
	}
	e->time_ns = bpf_ktime_get_ns();
	e->ep = p->ep;
	e->dir = dir;
	e->family = p->family;
	e->proto = p->proto;
	e->verdict = how & 0xff;
	e->tcp_flags = tcp_flags;
	e->flags = (how >> 8) & 0xff;
	if (p->bits & PKT_ENFORCED)
		e->flags |= FLOW_F_ENFORCED;
	e->sport = bpf_ntohs(p->sport);
	e->dport = bpf_ntohs(p->dport);
	e->svc_port = 0;
	e->proxy_port = how >> 16;
	e->peer_identity = peer;
	e->identity = p->identity;
	e->len = skb->len;
	e->pad = 0;
	__builtin_memcpy(e->saddr, p->saddr, 16);
	__builtin_memcpy(e->daddr, p->daddr, 16);
	__builtin_memset(e->svc_addr, 0, 16);
	if (p->bits & PKT_SVC) {
		__builtin_memcpy(t.saddr, p->daddr, 16);
		__builtin_memcpy(t.daddr, p->saddr, 16);
		t.sport = p->dport;
		t.dport = p->sport;
		t.proto = p->proto;
		t.family = p->family;
		rv = bpf_map_lookup_elem(&lb_revnat, &t);
		if (rv) {
			e->flags |= FLOW_F_TRANSLATED;
			__builtin_memcpy(e->svc_addr, rv->addr, 16);
			e->svc_port = bpf_ntohs(rv->port);
		}
	}
	bpf_ringbuf_submit(e, 0);
	s = bpf_map_lookup_elem(&flow_stats, &zero);
	if (s)
		s->flows++;
	return 0;
}

/* proxy_sock looks up the socket p goes to at the proxy port: the
 * connection's own socket when the proxy already has it (TCP: a request
 * or established socket with p's tuple; never a listener or a TIME_WAIT
 * socket, which would be some other process's port), else the proxy's
 * listener at the loopback address. UDP always goes to the proxy's one
 * socket per port. The caller releases the socket. */
static __always_inline struct bpf_sock *proxy_sock(struct __sk_buff *skb, struct pkt *p, __u16 port)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk = NULL;
	__u32 len = sizeof(t.ipv4);

	if (p->family == 4) {
		t.ipv4.saddr = p->saddr[0];
		t.ipv4.daddr = p->daddr[0];
		t.ipv4.sport = p->sport;
		t.ipv4.dport = p->dport;
	} else {
		len = sizeof(t.ipv6);
		__builtin_memcpy(t.ipv6.saddr, p->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, p->daddr, 16);
		t.ipv6.sport = p->sport;
		t.ipv6.dport = p->dport;
	}
	if (p->proto == IPPROTO_TCP) {
		sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
		if (sk && (sk->state == BPF_TCP_LISTEN || sk->state == BPF_TCP_TIME_WAIT)) {
			bpf_sk_release(sk);
			sk = NULL;
		}
		if (sk)
			return sk;
	}
	__builtin_memset(&t, 0, sizeof(t));
	if (p->family == 4) {
		t.ipv4.daddr = bpf_htonl(0x7f000001);
		t.ipv4.dport = bpf_htons(port);
	} else {
		t.ipv6.daddr[3] = bpf_htonl(1);
		t.ipv6.dport = bpf_htons(port);
	}
	if (p->proto == IPPROTO_TCP)
		return bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	return bpf_sk_lookup_udp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
}

/* proxy_assign hands p (TC ingress of the host veth) to the proxy's
 * socket at port, marked for local delivery; no socket (the proxy is
 * down, or listens elsewhere) drops it: L7 policy fails closed. */
static __noinline int proxy_assign(struct __sk_buff *skb, struct pkt *p, __u16 port, __u8 dir, __u32 peer)
{
	struct bpf_sock *sk;
	long err;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return drop(skb, p, dir, DROP_PROXY, peer);
	sk = proxy_sock(skb, p, port);
	if (!sk)
		return drop(skb, p, dir, DROP_PROXY, peer);
	err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	if (err)
		return drop(skb, p, dir, DROP_PROXY, peer);
	skb->mark = MARK_TO_PROXY_MAGIC | ((__u32)port << 16);
	/* A hairpinned frame still has the pod's MAC as destination. */
	bpf_skb_change_type(skb, 0 /* PACKET_HOST */);
	return TC_ACT_OK;
}

/* proxy_hairpin sends a packet to_container redirects to the proxy back
 * to the ingress of its host veth, marked with the port: from_container
 * assigns it there (handle). The mark survives: the redirect stays in the
 * node's netns. */
static __always_inline int proxy_hairpin(struct __sk_buff *skb, __u16 port)
{
	skb->mark = MARK_TO_PROXY_MAGIC | ((__u32)port << 16);
	return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

/* proxy_upstream reports whether a TCP packet on its way to the pod
 * belongs to a connection the L7 proxy opened from the pod's address
 * (the upstream side of an egress redirect keeps the client's address,
 * so that the peer, on this node or another, sees the client's
 * identity): a socket of the node's netns has p's tuple and is neither
 * a listener, a request nor in TIME_WAIT. Only a transparent socket can
 * hold a pod's address in the node's netns. */
static __always_inline int proxy_upstream(struct __sk_buff *skb, struct pkt *p)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *sk;
	__u32 len = sizeof(t.ipv4);
	int ours;

	if (p->family == 4) {
		t.ipv4.saddr = p->saddr[0];
		t.ipv4.daddr = p->daddr[0];
		t.ipv4.sport = p->sport;
		t.ipv4.dport = p->dport;
	} else {
		len = sizeof(t.ipv6);
		__builtin_memcpy(t.ipv6.saddr, p->saddr, 16);
		__builtin_memcpy(t.ipv6.daddr, p->daddr, 16);
		t.ipv6.sport = p->sport;
		t.ipv6.dport = p->dport;
	}
	sk = bpf_skc_lookup_tcp(skb, &t, len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	ours = sk->state != BPF_TCP_LISTEN && sk->state != BPF_TCP_TIME_WAIT && sk->state != BPF_TCP_NEW_SYN_RECV &&
	       sk->state != BPF_TCP_SYN_RECV;
	bpf_sk_release(sk);
	return ours;
}

/* direct_established reports whether p, on its way to the pod, is a
 * TCP packet without SYN that a local pod's from_container delivered
 * directly (PKT_DIRECT): with CT_F_OPENED or CT_F_DIRECT, only a packet
 * of a connection the sender's conntrack holds as begun by a SYN from
 * one of the two pods (lb_out) gets there. The L7 proxy's upstream
 * connections from this pod's address never are one: the proxy's
 * packets reach the sender through the host's stack (not marked), so
 * the sender's entry of that tuple lacks CT_F_DIRECT, and the sender's
 * answers, which begin nothing, cannot create a CT_F_OPENED one. Such a
 * packet skips proxy_upstream's socket lookup, as a conntrack reply
 * already does. A SYN (the sender's SYN-ACK of an upstream connection
 * whose tuple a stale entry holds) still gets the lookup. */
static __always_inline int direct_established(struct pkt *p)
{
	return (p->bits & PKT_DIRECT) && !(p->tcp_flags & TCP_F_SYN);
}

/* redirect sends an allowed packet of the original direction to the
 * proxy at port. */
static __always_inline int redirect(struct __sk_buff *skb, struct pkt *p, __u16 port, __u8 dir, __u32 peer)
{
	if (dir == DIR_EGRESS)
		return proxy_assign(skb, p, port, dir, peer);
	return proxy_hairpin(skb, port);
}

/* remote_direct reports whether local_deliver sends p, which the FIB
 * routes out of ifindex, no local endpoint's, straight there too: a
 * device whose programs deliver the peer's packets of the connection
 * straight to the endpoint as well (the tunnel device in tunnel mode,
 * node_config.tunnel_ifindex, overlay.c's from_overlay; a native-routing
 * uplink, node_config.uplinks, from_netdev's netdev_deliver), and a
 * destination in the node's or the cluster's pod CIDRs
 * (node_config.pods), which the masquerade never translates and
 * kube-proxy's rules never name; TCP and UDP only, as the receiving
 * side (an ICMP echo sent so would meet its reply alone in the node's
 * conntrack: INVALID). The peer's receiving program decides on the same
 * address (its source) and protocol (forward.h's fwd_direct_conn), so a
 * connection crosses each node's netfilter in both directions or in
 * neither: iptables conntrack (kube-proxy's INVALID drop in FORWARD)
 * never sees one direction alone. */
static __always_inline int remote_direct(__u32 ifindex, struct pkt *p)
{
	__u32 zero = 0;
	struct node_config_value *c = bpf_map_lookup_elem(&node_config, &zero);

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return 0;
	if (!c || !in_pods(c, p->family, p->daddr))
		return 0;
	if (c->tunnel_ifindex && c->tunnel_ifindex == ifindex)
		return 1;
	return is_uplink(c, ifindex) ? 2 : 0;
}

/* ct_uplink gives the egress entry of p, a packet the pod sends that
 * opens a connection (PKT_OPENS) and that local_deliver sends straight
 * out of an uplink, CT_F_UPLINK: its far side is routed through an
 * uplink, so netdev_deliver need not look up the reverse path of its
 * replies. */
static __noinline void ct_uplink(struct pkt *p)
{
	struct ct_key k = {
		.ep = p->ep,
		.dir = DIR_EGRESS,
		.family = p->family,
		.proto = p->proto,
		.sport = p->sport,
		.dport = p->dport,
	};
	struct ct_value *v;

	__builtin_memcpy(k.saddr, p->saddr, 16);
	__builtin_memcpy(k.daddr, p->daddr, 16);
	v = bpf_map_lookup_elem(&ct, &k);
	if (v && !(v->flags & CT_F_UPLINK))
		v->flags |= CT_F_UPLINK;
}

/* fib_addrs fills in fib's family and addresses from p: 0, or -1 for a
 * packet the FIB path leaves to the stack (a fragment: the host's
 * reassembly must see all of a datagram or none; IPv6 with extension
 * headers; not IP). */
static __always_inline int fib_addrs(struct bpf_fib_lookup *fib, struct pkt *p)
{
	if (p->frag)
		return -1;
	if (p->family == 4) {
		if (p->frag4)
			return -1; /* MF or an offset: a fragment */
		fib->family = AF_INET_;
		fib->ipv4_src = p->saddr[0];
		fib->ipv4_dst = p->daddr[0];
		return 0;
	}
	if (p->family == 6) {
		if (p->l4off != ETH_HLEN_ + sizeof(struct ipv6hdr))
			return -1; /* extension headers, a fragment maybe */
		fib->family = AF_INET6_;
		__builtin_memcpy(fib->ipv6_src, p->saddr, 16);
		__builtin_memcpy(fib->ipv6_dst, p->daddr, 16);
		return 0;
	}
	return -1;
}

/* local_deliver sends a packet from_container let out straight to its
 * destination's host veth when that is a local endpoint's (Cilium's
 * direct local delivery): bpf_redirect to the veth's egress, where the
 * destination's to_container gives it its verdict as it would after
 * the host's forwarding, past the host's IP stack (routing, netfilter,
 * the neighbour output). The FIB names the device (the endpoint's /32
 * or /128 route) and the MAC addresses; the TTL is decremented as the
 * host's forwarding would (forward.h's fwd_redirect). A remote pod's
 * packet goes straight to the tunnel device or to a native-routing
 * uplink the same way when remote_direct says so (Cilium's BPF host
 * routing: bpf_redirect_neigh to the FIB's next hop). Anything else is
 * left to the host's stack (TC_ACT_OK): another destination, a packet
 * too big for the device, a TTL running out (the stack answers with
 * ICMP), and every fragment or IPv6 packet with extension headers
 * (fib_addrs). Not bpf_redirect_peer into the destination's netns as
 * Cilium: that would skip to_container and the veth's qdisc (a chained
 * bandwidth plugin's shaping of what reaches the pod). A local
 * endpoint's packet is marked MARK_DIRECT_MAGIC, so that the
 * destination's to_container records the connection as delivered
 * directly (CT_F_DIRECT) and only such a connection's replies come back
 * this way: a reply whose request crossed the host's stack crosses it
 * too, whose netfilter may have translated the request (kube-proxy) and
 * reverses it on the reply. */
static __noinline int local_deliver(struct __sk_buff *skb, struct pkt *p)
{
	struct bpf_fib_lookup fib = { .l4_protocol = p->proto, .sport = p->sport, .dport = p->dport };
	__u32 ifindex, mark = MARK_DIRECT_MAGIC;
	long r, fib_r;

	if (fib_addrs(&fib, p))
		return TC_ACT_OK;
	fib.ifindex = skb->ifindex;
	r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r != BPF_FIB_LKUP_RET_SUCCESS && r != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	fib_r = r;
	ifindex = fib.ifindex;
	if (ifindex == skb->ifindex)
		return TC_ACT_OK;
	if (!bpf_map_lookup_elem(&endpoints, &ifindex)) {
		r = remote_direct(ifindex, p);
		if (!r)
			return TC_ACT_OK;
		if (r == 2 && (p->bits & PKT_OPENS))
			ct_uplink(p);
		mark = 0; /* keeps lb_out's MARK_FROM_ENDPOINT_MAGIC */
		r = fib_r;
	}
	return fwd_redirect(skb, &fib, r, p->family, mark);
}

/* lb_out finishes a passing packet whose conntrack answer is ct
 * (ct_is_reply's: CT_HIT and the flags; else not a reply, and ct is
 * ct_record's CT_F_OPENED or 0): a reply reaching the pod from a
 * service backend gets the service frontend as its source (lb.h); a
 * backend's reply to a NodePort client from outside goes on in
 * nodeport_reply (a tail call; without the kube-proxy-free mode the slot
 * is empty and the packet passes untranslated). Only replies of
 * connections recorded as translated (ct_reverse): lb_revnat is keyed by
 * the reply's tuple, which a later connection without translation from
 * the same client address and port to the same backend shares. */
static __always_inline int lb_out(struct __sk_buff *skb, struct pkt *p, __u8 dir, int ct)
{
	if (dir == DIR_EGRESS) {
		/* Decided by the pod's egress policy: not the host's
		 * (to_netdev, after masquerade). */
		skb->mark = MARK_FROM_ENDPOINT_MAGIC;
		if (ct_reverse(ct, CT_F_NODEPORT) && lb_nodeport_reply(p))
			bpf_tail_call(skb, &lb_progs, LB_PROG_NODEPORT_REPLY);
		/* A packet of a connection the pod opened (its entry
		 * began with a SYN, or is not TCP), or the reply of a
		 * connection whose requests came the same way. A TCP
		 * packet of a connection conntrack lost mid-way (evicted)
		 * may answer a request netfilter translated: through the
		 * host's stack, which reverses it. */
		if ((ct & CT_HIT) ? (ct & CT_F_DIRECT) : (ct & CT_F_OPENED))
			return local_deliver(skb, p);
		return TC_ACT_OK;
	}
	if (ct_reverse(ct, CT_F_SVC) && lb_reverse(skb, p, 0) < 0)
		return drop(skb, p, dir, DROP_MALFORMED, 0);
	return TC_ACT_OK;
}

/* endpoint_of fills in p's endpoint from the host veth the packet is on
 * and returns its policy maps (NULL: the interface has no endpoint).
 * skb->ifindex is the host veth at TC ingress (from_container) and
 * egress (to_container) alike, and still is for a packet to_container
 * hairpins to the ingress of the same veth (proxy_hairpin redirects to
 * skb->ifindex). A missing endpoints entry, or one without both policy maps,
 * leaves p->ep 0. *epp is the entry (the endpoint's addresses). */
static __always_inline void *endpoint_of(struct __sk_buff *skb, struct pkt *p, void **cidr,
					 struct endpoint_info **epp)
{
	__u32 ifindex = skb->ifindex, slot;
	struct endpoint_info *ep;
	void *pol;

	ep = bpf_map_lookup_elem(&endpoints, &ifindex);
	if (!ep)
		return NULL;
	*epp = ep;
	slot = ep->slot;
	pol = bpf_map_lookup_elem(&policy_maps, &slot);
	*cidr = bpf_map_lookup_elem(&cidr_maps, &slot);
	if (!pol || !*cidr)
		return NULL;
	p->ep = ep->id;
	p->identity = ep->identity;
	return pol;
}

/* hairpinned reports whether to_container sent the packet back to the
 * ingress of its host veth for the L7 proxy (proxy_hairpin): it is
 * traffic to the pod, with the peer's source. Pods cannot forge the
 * mark: crossing the veth out of their netns clears skb->mark. */
static __always_inline int hairpinned(struct __sk_buff *skb)
{
	return (skb->mark & MARK_MAGIC_MASK) == MARK_TO_PROXY_MAGIC;
}

/* arp_source_ok reports whether an ARP frame from the pod is an
 * Ethernet/IPv4 one whose sender address is the endpoint's IPv4
 * address: the host would otherwise learn a neighbour entry for another
 * pod's address from it. */
static __always_inline int arp_source_ok(struct __sk_buff *skb, struct endpoint_info *ep)
{
	struct {
		__be16 htype, ptype;
		__u8 hlen, plen;
		__be16 op;
		__u8 sha[6];
		__u32 spa; /* unaligned in the frame, copied whole */
	} __attribute__((packed)) arp;

	if (!(ep->flags & ENDPOINT_F_IPV4) || bpf_skb_load_bytes(skb, ETH_HLEN_, &arp, sizeof(arp)))
		return 0;
	return arp.htype == bpf_htons(1) && arp.ptype == bpf_htons(ETH_P_IP) && arp.hlen == 6 &&
	       arp.plen == 4 && arp.spa == ep->ipv4;
}

/* source_ok reports whether the pod may send p (from_container): an IP
 * packet's source must be the endpoint's address of its family
 * (Cilium's DROP_INVALID_SIP); a family the endpoint has no address of
 * has no valid source. The one exception is essential ICMPv6 (p->ndp:
 * neighbour discovery, MLD, errors) from a link-local source (fe80::/10,
 * which the host never forwards off the link and the ipcache never
 * holds) or from :: (duplicate address detection, MLD before the pod has
 * an address): without it the pod could not resolve its gateway. Other
 * traffic from link-local sources is dropped, as Cilium does (it handles
 * ICMPv6 before its source check). IPv4 has no exception: 0.0.0.0 would
 * be DHCP, which pods do not use. ARP frames must carry the IPv4 address
 * as sender (arp_source_ok); other non-IP frames never get here (l3_ok
 * dropped them), and IP frames whose header has no readable source (the
 * kernel drops them) are left to the rest of the verdict. */
static __always_inline int source_ok(struct __sk_buff *skb, struct endpoint_info *ep, struct pkt *p)
{
	switch (p->family) {
	case 4:
		return (ep->flags & ENDPOINT_F_IPV4) && p->saddr[0] == ep->ipv4;
	case 6:
		if (p->ndp && ((p->saddr[0] & bpf_htonl(0xffc00000)) == bpf_htonl(0xfe800000) ||
			       !(p->saddr[0] | p->saddr[1] | p->saddr[2] | p->saddr[3])))
			return 1;
		return (ep->flags & ENDPOINT_F_IPV6) && p->saddr[0] == ep->ipv6[0] && p->saddr[1] == ep->ipv6[1] &&
		       p->saddr[2] == ep->ipv6[2] && p->saddr[3] == ep->ipv6[3];
	}
	if (p->l3proto == ETH_P_ARP)
		return arp_source_ok(skb, ep);
	return 1;
}

/* l3_ok reports whether the pod may send a frame of p's ethertype: an
 * untagged IPv4, IPv6 or ARP frame (see the header comment: a VLAN tag
 * skb->vlan_present shows was pulled off before TC, and the kernel strips
 * more of them after TC). */
static __always_inline int l3_ok(struct __sk_buff *skb, struct pkt *p)
{
	if (skb->vlan_present)
		return 0;
	return p->l3proto == ETH_P_IP || p->l3proto == ETH_P_IPV6 || p->l3proto == ETH_P_ARP;
}

/* to_tunnel_port reports whether p is UDP to the node's tunnel port
 * (tunnel mode only: the port is 0 in native routing). Non-first
 * fragments have no port: without their first fragment, which this
 * drops, they are never reassembled. */
static __always_inline int to_tunnel_port(struct pkt *p)
{
	__u32 zero = 0;
	struct node_config_value *c = bpf_map_lookup_elem(&node_config, &zero);

	return c && c->tunnel_port && p->proto == IPPROTO_UDP && !p->frag && bpf_ntohs(p->dport) == c->tunnel_port;
}

/* unknown_pod reports whether the peer of p (direction dir), whose
 * address the ipcache resolved to peer, is a pod the ipcache holds no
 * entry of: peer is world or a policy CIDR identity (a prefix covering
 * the address, none of its own) and the address lies in one of the
 * node's or the cluster's pod CIDRs (node_config.pods). A full ipcache
 * (--ipcache-max) refuses new pods' entries; as world such a pod could
 * pass a rule allowing world that a rule naming its labels denies, so
 * an enforced direction drops it (DROP_UNKNOWN_POD): fail closed. */
static __noinline int unknown_pod(struct pkt *p, __u8 dir, __u32 peer)
{
	__u32 zero = 0, *a = dir == DIR_EGRESS ? p->daddr : p->saddr;
	struct node_config_value *c;

	if (peer != IDENTITY_WORLD && (peer < IDENTITY_CIDR_MIN || peer >= IDENTITY_NODE_SCOPE))
		return 0;
	c = bpf_map_lookup_elem(&node_config, &zero);
	return c && in_pods(c, p->family, a);
}

static __always_inline int handle(struct __sk_buff *skb, __u8 dir)
{
	struct pkt p = {};
	struct endpoint_info *ep = NULL;
	struct policy_value *v;
	void *pol, *cidr = NULL;
	__u16 proxy_port = 0;
	__u64 now;
	__u32 peer = 0;
	int r, hairpin = 0;

	r = parse(skb, &p);
	pol = endpoint_of(skb, &p, &cidr, &ep);
	if (!pol || !cidr || !ep)
		/* Fail closed: no policy is known for this interface. */
		return drop(skb, &p, dir, DROP_NO_ENDPOINT, 0);
	p.bits = ep->flags & ENDPOINT_F_AUDIT ? PKT_AUDIT : 0;
	if ((ep->flags & ENDPOINT_F_ENFORCE_KNOWN) &&
	    !(ep->flags & (dir == DIR_INGRESS ? ENDPOINT_F_ENFORCE_INGRESS : ENDPOINT_F_ENFORCE_EGRESS)))
		p.bits |= PKT_UNENFORCED;
	if (dir == DIR_INGRESS && skb->mark == MARK_NODEPORT_MAGIC)
		p.bits |= PKT_NODEPORT;
	if (dir == DIR_INGRESS &&
	    (skb->mark == MARK_DIRECT_MAGIC || (skb->mark & MARK_MAGIC_MASK) == MARK_IDENTITY_DIRECT_MAGIC))
		p.bits |= PKT_DIRECT;
	if (dir == DIR_INGRESS && skb->mark == MARK_UPLINK_DIRECT_MAGIC)
		p.bits |= PKT_DIRECT | PKT_UPLINK;
	if (dir == DIR_EGRESS && !hairpinned(skb) && !l3_ok(skb, &p))
		return drop(skb, &p, dir, DROP_UNKNOWN_L3, 0);
	if (dir == DIR_EGRESS && !hairpinned(skb) && !source_ok(skb, ep, &p))
		return drop(skb, &p, dir, DROP_INVALID_SOURCE, 0);
	if (r == PARSE_NOT_IP) {
		if (p.l3proto == ETH_P_ARP || !enforced(pol, &p, dir))
			return TC_ACT_OK;
		return drop(skb, &p, dir, DROP_UNKNOWN_L3, 0);
	}
	if (r == PARSE_BAD) {
		if (!enforced(pol, &p, dir))
			return TC_ACT_OK;
		return drop(skb, &p, dir, DROP_MALFORMED, 0);
	}
	if (p.icmp_err && !p.frag) {
		/* Related to a connection of the pod: passes, with the
		 * frontend back in the quoted packet of a Service flow. */
		r = lb_icmp_related(skb, &p, bpf_ktime_get_ns(), dir);
		if (r < 0)
			return drop(skb, &p, dir, DROP_MALFORMED, 0);
		if (r > 0)
			return TC_ACT_OK;
	}
	if (p.ndp)
		return TC_ACT_OK;
	if (dir == DIR_EGRESS && hairpinned(skb))
		/* Hairpinned by to_container, which decided the verdict. */
		return proxy_assign(skb, &p, skb->mark >> 16, DIR_INGRESS, 0);
	if (dir == DIR_EGRESS) {
		/* Services first: policy and conntrack see the backend. */
		r = lb_translate(skb, &p);
		hairpin = r == LB_HAIRPIN;
		if (r != LB_PASS && !hairpin)
			return drop(skb, &p, dir, r == LB_NO_BACKEND ? DROP_NO_BACKEND : DROP_MALFORMED, 0);
		if (to_tunnel_port(&p))
			return drop(skb, &p, dir, DROP_TUNNEL_PORT, 0);
	}
	/* The conntrack clock: CLOCK_MONOTONIC at the last tick (what
	 * ctgc compares against, ktimeNow, at most a tick ahead: an entry
	 * looks that much older, against lifetimes of seconds), a few ns
	 * a packet instead of a clocksource read. */
	now = bpf_ktime_get_coarse_ns();
	r = p.frag ? 0 : ct_is_reply(&p, dir, now);
	if (r) {
		/* A reply to the hairpin address goes back into the pod,
		 * whose to_container translates it. */
		if (dir == DIR_EGRESS && lb_is_hairpin(p.family, p.daddr))
			return lb_hairpin_redirect(skb, 0);
		return lb_out(skb, &p, dir, r);
	}
	if (dir == DIR_EGRESS && !p.frag && opens_conn(&p))
		p.bits |= PKT_OPENS;
	if (dir == DIR_INGRESS && p.proto == IPPROTO_TCP && !p.frag && !direct_established(&p) &&
	    proxy_upstream(skb, &p))
		/* An answer to the proxy's upstream connection from the pod's
		 * address: to the proxy's socket (proxy_sock finds it by its
		 * tuple), past the pod's policy: the proxy decided. */
		return proxy_hairpin(skb, 0);
	/* The host sends to the pod: the host's egress policy first. */
	if (dir == DIR_INGRESS && host_local(skb, &p, dir) != TC_ACT_OK)
		return TC_ACT_SHOT;
	if (enforced(pol, &p, dir)) {
		p.bits |= PKT_ENFORCED;
		/* r: the drop reason of a would-be drop (0: allowed). */
		r = 0;
		peer = tunnel_identity(skb, dir);
		if (!peer) {
			peer = peer_identity(&p, dir);
			if (unknown_pod(&p, dir, peer))
				r = DROP_UNKNOWN_POD;
		}
		v = r ? NULL : policy_lookup(pol, peer, &p, dir);
		if (v) {
			__sync_fetch_and_add(&v->packets, 1);
			__sync_fetch_and_add(&v->bytes, skb->len);
			if (v->deny)
				r = DROP_POLICY_DENY;
		}
		if (!r && cidr_match(cidr, &p, dir | CIDR_DIR_DENY, skb->len))
			r = DROP_POLICY_DENY;
		if (!r) {
			if (v) {
				if (!from_proxy(skb))
					proxy_port = v->proxy_port;
			} else if (!cidr_match(cidr, &p, dir, skb->len)) {
				r = p.frag ? DROP_FRAGMENT : DROP_POLICY;
			}
		}
		if (r) {
			/* Audit mode: a would-be policy drop passes, reported
			 * as DROP_POLICY_AUDIT (drop() only counts and
			 * reports). */
			if (!(p.bits & PKT_AUDIT) || r == DROP_FRAGMENT)
				return drop(skb, &p, dir, r, peer);
			drop(skb, &p, dir, DROP_POLICY_AUDIT, peer);
			/* The rest of the allowed path without a proxy port
			 * (no entry allowed it), kept apart so that few values
			 * live across the call (the verifier's stack bound). */
			if (dir == DIR_EGRESS && host_local(skb, &p, dir) != TC_ACT_OK)
				return TC_ACT_SHOT;
			r = ct_record(&p, dir, bpf_ktime_get_ns());
			if (hairpin)
				return lb_hairpin_redirect(skb, p.identity);
			return lb_out(skb, &p, dir, r & CT_F_OPENED);
		}
	}
	/* The pod sends to the host: the host's ingress policy after the
	 * pod's egress policy. */
	if (dir == DIR_EGRESS && host_local(skb, &p, dir) != TC_ACT_OK)
		return TC_ACT_SHOT;
	if (proxy_port)
		/* To the proxy, not the pod: the pod's answers to the
		 * proxy's upstream connection, which shares the tuple, cross
		 * the host's stack to its socket. */
		p.bits &= ~PKT_DIRECT;
	r = p.frag ? 0 : ct_record(&p, dir, now);
	if (r & CT_NEW)
		/* A new connection: its flow (a hairpin goes back into the
		 * pod, never to the proxy). */
		flow_report(skb, &p, dir,
			    hairpin ? FLOW_FORWARDED | FLOW_F_HAIRPIN << 8
				    : (proxy_port ? FLOW_REDIRECTED | (__u32)proxy_port << 16 : FLOW_FORWARDED),
			    peer);
	if (hairpin)
		/* The pod's own identity: its ingress policy decides on the
		 * pod reaching itself, not on the hairpin address (world). */
		return lb_hairpin_redirect(skb, p.identity);
	if (proxy_port && !p.frag)
		return redirect(skb, &p, proxy_port, dir, peer);
	return lb_out(skb, &p, dir, r & CT_F_OPENED);
}

SEC("tc")
int from_container(struct __sk_buff *skb)
{
	return handle(skb, DIR_EGRESS);
}

SEC("tc")
int to_container(struct __sk_buff *skb)
{
	return handle(skb, DIR_INGRESS);
}

/* netdev_deliver sends a packet arriving on a native-routing uplink
 * (node_config.uplinks) from a pod of another node straight to the host
 * veth of the local endpoint the FIB routes it to, past the host's
 * stack, as from_overlay's overlay_deliver does in tunnel mode; the
 * endpoint's to_container gives its verdict there as before, with the
 * source's identity from the ipcache by its address (as for a packet
 * the stack forwarded: nothing about the sender is taken from the
 * packet but its source address), and records the connection as
 * delivered so (MARK_UPLINK_DIRECT_MAGIC: CT_F_DIRECT). Only where the other
 * direction leaves this node the same way (from_container's
 * remote_direct), so that netfilter sees both directions or neither:
 * TCP or UDP, the source in a pod CIDR of the node or the cluster
 * (node_config.pods), the connection one whose other direction goes
 * straight too (forward.h's fwd_direct_conn), and the source's own
 * route leaving through an uplink (a second FIB lookup, from the
 * endpoint's veth as from_container's: the reverse path). The last is
 * the stack's strict reverse-path filter (rp_filter 1) for these
 * packets: a source spoofed from the underlay with the address of a
 * local pod (whose route is its host veth) or of anything routed
 * elsewhere goes up the stack, whose rp_filter and netfilter (rpfilter)
 * decide on it as before, and never reaches the endpoint with an
 * identity the stack would have refused it. The lookup is skipped for a
 * connection whose entry has CT_F_UPLINK: its far side was found routed
 * through an uplink already (this check on its first packet, marked
 * MARK_UPLINK_DIRECT_MAGIC; or the FIB of the pod's own first packet,
 * local_deliver's ct_uplink). Anything else goes up the
 * stack too (TC_ACT_OK), as fragments, IPv6 extension headers, TTLs
 * running out and packets too big for the veth. */
static __noinline int netdev_deliver(struct __sk_buff *skb, struct pkt *p)
{
	struct bpf_fib_lookup fib = { .l4_protocol = p->proto, .sport = p->sport, .dport = p->dport };
	struct node_config_value *c;
	struct endpoint_info *ep;
	__u32 zero = 0, ifindex, f;
	long r, rr;

	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP)
		return TC_ACT_OK;
	c = bpf_map_lookup_elem(&node_config, &zero);
	if (!c || !is_uplink(c, skb->ifindex) || !in_pods(c, p->family, p->saddr))
		return TC_ACT_OK;
	if (fib_addrs(&fib, p))
		return TC_ACT_OK;
	fib.ifindex = skb->ifindex;
	r = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (r != BPF_FIB_LKUP_RET_SUCCESS && r != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	ifindex = fib.ifindex;
	ep = bpf_map_lookup_elem(&endpoints, &ifindex);
	if (!ep)
		return TC_ACT_OK;
	f = fwd_direct_conn(ep->id, p->family, p->saddr, p->daddr, p->proto, p->sport, p->dport, p->tcp_flags);
	if (!f)
		return TC_ACT_OK;
	if (!(f & CT_F_UPLINK)) {
		/* The reverse path: the endpoint's reply to the source. */
		struct bpf_fib_lookup rev = { .l4_protocol = p->proto, .sport = p->dport, .dport = p->sport };

		rev.family = fib.family;
		if (p->family == 4) {
			rev.ipv4_src = p->daddr[0];
			rev.ipv4_dst = p->saddr[0];
		} else {
			__builtin_memcpy(rev.ipv6_src, p->daddr, 16);
			__builtin_memcpy(rev.ipv6_dst, p->saddr, 16);
		}
		rev.ifindex = ifindex;
		rr = bpf_fib_lookup(skb, &rev, sizeof(rev), 0);
		if ((rr != BPF_FIB_LKUP_RET_SUCCESS && rr != BPF_FIB_LKUP_RET_NO_NEIGH) || !is_uplink(c, rev.ifindex))
			return TC_ACT_OK;
	}
	return fwd_redirect(skb, &fib, r, p->family, MARK_UPLINK_DIRECT_MAGIC);
}

/* from_netdev runs at TCX ingress of the node's uplink devices (loaded
 * once per node, not per endpoint): with the kube-proxy replacement or
 * the host firewall (no NETDEV_F_DELIVER_ONLY) NodePort translation first
 * (nodeport.h), then the host firewall for traffic to the node's own
 * addresses (hostfw.h); then, in native routing, the direct delivery to
 * a local endpoint (netdev_deliver). The three take disjoint packets: a
 * NodePort's frontend and the host firewall's are node addresses, not
 * pods'. Drops count under endpoint 0. */
SEC("tc")
int from_netdev(struct __sk_buff *skb)
{
	struct node_config_value *c;
	struct pkt p = {};
	__u32 zero = 0;
	int r;

	if (parse(skb, &p) != PARSE_OK || p.ndp)
		return TC_ACT_OK;
	c = bpf_map_lookup_elem(&node_config, &zero);
	if (!c)
		return TC_ACT_OK;
	if (c->netdev_flags & NETDEV_F_DELIVER_ONLY)
		return netdev_deliver(skb, &p);
	r = lb_nodeport(skb, &p);
	switch (r) {
	case LB_PASS:
		/* Not a NodePort flow: the host firewall decides on traffic
		 * to the node's own addresses (hostfw.h). */
		r = host_verdict(skb, &p, DIR_INGRESS, 0);
		return r == TC_ACT_OK ? netdev_deliver(skb, &p) : r;
	case LB_REDIRECT:
		r = lb_fib_redirect(skb, &p);
		return r < 0 ? drop(skb, &p, DIR_INGRESS, DROP_NO_ROUTE, 0) : r;
	case LB_NO_BACKEND:
		return drop(skb, &p, DIR_INGRESS, DROP_NO_BACKEND, 0);
	case LB_NAT_EXHAUSTED:
		return drop(skb, &p, DIR_INGRESS, DROP_NAT_EXHAUSTED, 0);
	}
	return drop(skb, &p, DIR_INGRESS, DROP_MALFORMED, 0);
}

/* to_netdev runs at egress of the node's devices with the host firewall
 * on (hostfw.h): the host's own packets (its address as source) are
 * checked against the host endpoint's egress policy and their
 * connections recorded, so that the replies pass from_netdev. A pod's
 * packet masqueraded to the node's address (marked
 * MARK_FROM_ENDPOINT_MAGIC by from_container) is only recorded: the
 * pod's egress policy decided on it. */
SEC("tc")
int to_netdev(struct __sk_buff *skb)
{
	struct pkt p = {};

	if (parse(skb, &p) != PARSE_OK)
		return TC_ACT_OK;
	return host_verdict(skb, &p, DIR_EGRESS,
			    (skb->mark & MARK_MAGIC_MASK) == MARK_FROM_ENDPOINT_MAGIC);
}

/* nodeport_reply: a local backend's reply to a NodePort client from
 * outside, tail-called from its from-container after policy: the
 * NodePort frontend becomes its source and it is redirected to the
 * uplink (nodeport.h). Loaded once per node with from_netdev. Its drops
 * count under endpoint 0, as from_netdev's (skb->ifindex is still the
 * endpoint's host veth here, but the verdict was from_container's). */
SEC("tc")
int nodeport_reply(struct __sk_buff *skb)
{
	struct pkt p = {};
	int r;

	if (parse(skb, &p) != PARSE_OK)
		return TC_ACT_OK;
	r = lb_reverse(skb, &p, LB_REVNAT_NODEPORT);
	if (r < 0)
		return drop(skb, &p, DIR_EGRESS, DROP_MALFORMED, 0);
	if (r == 0)
		return TC_ACT_OK;
	r = lb_fib_redirect(skb, &p);
	return r < 0 ? drop(skb, &p, DIR_EGRESS, DROP_NO_ROUTE, 0) : r;
}
