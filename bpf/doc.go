// Package bpf owns the eBPF C sources of the endpoint programs
// (endpoint.c, endpoint.h), their bpf2go-generated Go bindings and the
// committed objects (endpoint_bpfel.o, endpoint_bpfeb.o), and the map
// layouts: the shared ipcache LPM trie, the endpoints map (host veth
// ifindex -> endpoint ID, identity), the per-endpoint policy map
// (identity rules) and CIDR policy map (CIDR rules, decided on the peer's
// address), the shared conntrack LRU, the drop counters and the drop-notification ring
// buffer. It only parses the embedded object (LoadEndpoint); datapath/
// loads, attaches and pins it.
//
// Programs: from_container runs at ingress of the host veth (the pod's
// egress), to_container at egress (the pod's ingress); both are loaded
// once per node and find the endpoint by the host veth's ifindex in the
// endpoints map, its policy maps through the policy_maps and cidr_maps
// outer maps (HASH_OF_MAPS keyed by a slot; see endpoint.c). In the
// kube-proxy-free mode, with the host firewall and in native routing
// (direct delivery from the uplinks: netdev_deliver) from_netdev runs at
// TCX ingress of the node's uplinks; in the kube-proxy-free mode
// nodeport_reply is from_container's tail call
// (lb_progs), and sock.c's cgroup programs translate at the socket
// (Sock, its own object and bindings, sharing the lb_* maps). The
// verdict rules and the decisions for fragments, non-IP and VLAN-tagged
// frames, the tunnel port, IPv6 extension headers and ICMP are in
// endpoint.c's header comment; node_config (one entry) tells the
// endpoint programs the node's tunnel port, pod CIDRs, tunnel device and
// uplinks. forward.h holds what the direct paths past the host's stack
// share (endpoint.c's local_deliver and netdev_deliver, nodeport.h,
// overlay.c's overlay_deliver): the TTL decrement, the redirect to the
// FIB's device and the conntrack rule for packets from other nodes.
//
// Tunnel mode: overlay.c (Overlay, its own object) runs on the VXLAN
// device: to_overlay puts the source identity in the VNI, from_overlay
// believes it only from a known node's address (tunnel_nodes), for a
// source that node hosts (the ipcache, the tunnel map of pod CIDRs, its
// addresses) and never a reserved identity to_overlay does not send; its
// drops count in the endpoint programs' drops map under endpoint 0.
//
// Kernel: TCX attach needs Linux 6.6 or later (developed and measured
// on 6.18); datapath/ attaches the endpoint programs with clsact +
// cls_bpf by default, and the shared devices' with clsact + cls_bpf
// where TCX is missing. The policy maps are LPM tries (see endpoint.c for why), the
// drop-notification ring buffer needs 5.8.
//
// Generation: `make generate` (go generate ./bpf/) runs bpf2go
// (cilium/ebpf v0.22.0, a go.mod tool) with Debian clang 14.0.6 and
// libbpf-dev 1.1 headers (apt-get install clang llvm libbpf-dev). The
// generated files are committed: building and testing never need clang.
//
// How it works (ARCHITECTURE.md has the map):
//
// `bpf/lb.h` — service translation inside the endpoint programs
// (`lb_translate` before conntrack and policy in from-container,
// `lb_reverse` last in to-container) and its maps: `lb_frontends`,
// `lb_backends` ({service ID, slot} -> backend), `lb_ct` (a connection's
// backend), `lb_revnat` (the reply's frontend, used only for replies
// whose conntrack entry says the connection was translated:
// `ct_value.flags`), `lb_affinity`;
// `datapath/bpf_lb_linux.go` writes and reads them
// (`datapath.ServiceDatapath`, `services.go`; the Fake's in
// `fake_services.go`). A hairpin (the chosen backend is the client
// itself) is also SNATed to the hairpin address (169.254.42.1,
// 100::a9fe:2a01) and redirected back into the pod both ways
// (`lb_hairpin_redirect`); ICMP errors quoting a connection of the
// endpoint are related and pass, a Service flow's with the frontend put
// back in the quoted packet (`lb_icmp_related`). The kube-proxy-free mode adds `bpf/nodeport.h`
// (`from_netdev` in `endpoint.c`, loaded once per node on the uplinks:
// NodePort DNAT, SNAT for remote backends, FIB redirect; maps `lb_nat`,
// `lb_nat_rev`; `nodeport_reply`, tail-called through `lb_progs` by
// from-container for a local backend's reply, so the FIB redirect is not
// verified again in every endpoint's program: from-container's verified
// instructions 4,667 -> 4,930 instead of 6,326 inline, measured before the
// L7 redirect merge) and `bpf/sock.c` (the cgroup socket programs, map
// `lb_sock`); `datapath/bpf_kpr_linux.go` attaches them (pinned links
// under `<bpffs>/socklb/` and `<bpffs>/netdev/`) or detaches them when the
// mode is off (`LinuxConfig.Services`).
//
// `bpf/` — the endpoint programs: `endpoint.c` (from-container at ingress
// of the host veth, to-container at egress, loaded once per node: the
// endpoint comes from the `endpoints` map by `skb->ifindex`, its policy
// maps from `policy_maps`/`cidr_maps` by the slot its entry names (slots
// are filled ahead of time: every user-space write to a map of maps waits
// for an RCU grace period), an interface without an entry drops everything
// as `no-endpoint`; the entry also holds the endpoint's addresses, and
// from-container drops what the pod sends from any other source as
// `invalid-source`; the verdict rules and the fragment/non-IP/IPv6/ICMP
// decisions are its header comment, essential ICMPv6 never dropped),
// `endpoint.h` (map layouts; bpf2go generates the Go types from them),
// `overlay.c` (tunnel mode, on the VXLAN device: `to_overlay` at TCX
// egress sets the tunnel key, outer destination = the ipcache entry's
// tunnel endpoint or the tunnel map's node for the destination's pod CIDR,
// VNI = the source's identity; `from_overlay` at TCX ingress puts the VNI
// into skb->mark for `to_container`, which prefers it to the ipcache's
// identity of the source address), and the committed bpf2go output. `make
// generate` rebuilds it with Debian clang 14.0.6 (bpf/doc.go); nothing
// else needs clang.
package bpf
