// Package dnsproxy is the agent's DNS proxy: it receives the DNS queries
// the BPF programs assign to its transparent sockets (UDP and TCP, in
// the host netns, datapath.TransparentSockets), refuses the names the
// endpoint's rules.dns do not allow, forwards the others to the server
// the pod asked (the original destination) and holds each answer until
// the agent realised the learned addresses (System.LearnFQDN, a bounded
// wait outside the actors); then the answer goes back to the pod from
// the server's address. It runs in the agent (not its own process) so
// that the hold is one front door call.
//
// How it works (ARCHITECTURE.md has the map):
//
// `pkg/agent/dnsproxy` — the DNS proxy (`--dns-proxy`, miekg/dns):
// `serve.go` reads the transparent UDP and TCP sockets the datapath opens
// in the host netns at 127.0.0.1 and [::1] (`datapath.TransparentSockets`:
// IP_TRANSPARENT, IP_RECVORIGDSTADDR and their IPv6 twins; UDP answers
// leave from a socket bound to the server's address, either family), `proxy.go` decides each query from the asking
// endpoint's `MapState.DNS` entry for the server (index reads: endpoint by
// address, ipcache lookup), forwards it to the original destination from
// the host netns, and holds the answer on `System.LearnFQDN` (bounded). In
// the agent, not its own process: the hold is one front door call that
// ends when the endpoint actor realised the addresses; a separate process
// would need a second versioned channel (as xDS for the HTTP proxy) just
// to learn that, and Cilium keeps its DNS proxy in the agent for the same
// reason.
package dnsproxy
