// Package l7proxy is the agent's half of the L7 (HTTP, gRPC, Kafka) proxy: the xDS
// server the agent configures the proxy through (Server, on a unix
// socket), the tracking of the configuration versions it acknowledged or
// rejected (Tracker), the supervisor that starts and restarts it
// (Supervisor), the socket its access records arrive on (AccessServer)
// and the transparent UDP sockets the DNS proxy uses. The proxy process
// itself (cmd/membrane-proxy) is package proxy, below this one; what both
// agree on is package xdsapi. Neither binary links the other's half
// (test/arch TestProxyHalves).
//
// The configuration is one xDS resource type served over the aggregated
// discovery service (go-control-plane's server and LinearCache): one
// resource per endpoint with L7 policy ("ep/<id>", an EndpointPolicy)
// and one "ipcache" resource (IPCache). Each resource is a JSON document
// in a google.protobuf.BytesValue: this machine has no protoc to
// generate a dedicated message, and the JSON documents are the policy
// model's own types. The version is the LinearCache's counter ("v<N>");
// the proxy acknowledges a version after applying it whole, or rejects
// it (error_detail set) leaving the previous one in force.
//
// How it works (ARCHITECTURE.md has the map):
//
// The halves: `proxy/proxy.go` (what `cmd/membrane-proxy`
// runs: a transparent HTTP proxy enforcing each endpoint's HTTP rules per
// peer identity, 403 otherwise, and its xDS client), `proxy/transparent.go` (the
// IP_TRANSPARENT listener; upstream connections marked with the client's
// identity, HTTP/1.x or h2c as the client spoke, from the client's own
// address when it is a local endpoint with L7 policy), `proxy/h2.go`
// (HTTP/1.x and h2c on one listener, gRPC denials), `proxy/kafka.go` and
// `proxy/kafkamsg.go` (the Kafka listener: request headers parsed, bodies
// decoded with franz-go's kmsg for their topics, denials answered
// TOPIC_AUTHORIZATION_FAILED with the request's correlation ID), `access.go` (access records: the proxy queues one per
// request, never waiting, and sends it as a JSON datagram to the agent's
// unixgram socket; the agent turns it into an `l7-access` event and a
// counter, `pkg/agent/l7access.go`), `server.go` (the agent's xDS server:
// go-control-plane's ADS server and `LinearCache` on a unix socket;
// ACK/NACK seen in the stream callbacks by response nonce), `tracker.go`
// (versions endpoints wait for), `supervisor.go` (runs and restarts the
// process with backoff; the proxy exits by itself when the agent is no
// longer its parent, `--parent-pid`, so a killed agent's proxy never keeps
// the port). xDS resources are JSON documents (`Resource`: one endpoint's
// L7 entries, or the ipcache) in `google.protobuf.BytesValue`, not Envoy's
// own types: no protoc here to generate a dedicated message, and the proxy
// is ours. `datapath/linux_l7_linux.go` wires it into the Linux datapath
// (started by Init when `LinuxConfig.L7.ProxyPath` is set, run through
// nsenter in `HostNetns`; Realize publishes, then writes the policy map
// with proxy ports, and reports the wait; ipcache changes mirrored to the
// proxy; the redirect's ip rule and local route).
//
// L7 versions only grow. The Linux datapath publishes an endpoint's L7
// configuration to the xDS server (`datapath/l7proxy`), which gives it a
// version; the endpoint revision waits for the proxy's ACK of a version at
// least that high (`l7proxy.Tracker`); a NACK of a version fails the waits
// it covers. A restarted proxy subscribes afresh, gets the whole current
// configuration and its ACK completes what is pending.
//
// L7 redirect is a policy map value. A policy map entry carries a proxy
// port (`policy_value.proxy_port`, 0: none). When the entry allows a
// packet and has a port, the endpoint program hands it to the socket
// listening on that port at 127.0.0.1 (::1) of the node's netns with
// `bpf_sk_assign`, keeping its addresses: from_container (TC ingress)
// directly, to_container (TC egress, where `bpf_sk_assign` cannot run) by
// marking it and redirecting it to its veth's ingress, where
// from_container assigns it. The mark `MARK_TO_PROXY_MAGIC` and one ip
// rule (fwmark 0x4f/0xff -> table 2040, `local default dev lo`) make the
// host deliver it locally; early demux is off in the node's netns (see
// `proxyRoute`). The proxy reads the original destination as the accepted
// socket's local address (IP_TRANSPARENT), resolves the client's identity
// from its ipcache copy, answers from the original destination (the pod
// sees its peer), and marks its upstream connections `MARK_PROXY_MAGIC |
// identity<<8`: the peer's program takes that identity and never redirects
// them again (one proxy pass checks both sides' rules). A local client's
// upstream connection is bound to the client's address (IP_TRANSPARENT),
// so a peer on another node takes the client's identity from the address
// (native routing: its ipcache; tunnel: the VNI); the client's
// to_container hands the answers to the proxy's socket (`proxy_upstream`
// in bpf/endpoint.c). No iptables.
// `MapState.Redirects` maps each redirected key to its proxy port (an
// entry whose parser has no port is refused with `policy.ErrNoProxy`:
// never allowed around the proxy) and `syncPolicyMap` writes it. UDP is
// redirected to the proxy's one socket per port (`bpf_sk_lookup_udp` at
// the loopback address): `l7proxy.ListenTransparentUDP` (IP_TRANSPARENT,
// IP_RECVORIGDSTADDR), `ReadOriginal` (the datagram's original
// destination) and `ReplyFrom` (answer from that address, so the pod's
// connected socket takes it); datapath.TestL7RedirectUDP uses them.
package l7proxy
