// Package dnsproxy is the agent's DNS proxy: it receives the DNS queries
// the BPF programs assign to its transparent sockets (UDP and TCP, in
// the host netns, datapath.TransparentSockets), refuses the names the
// endpoint's rules.dns do not allow, forwards the others to the server
// the pod asked (the original destination) and holds each answer until
// the agent realised the learned addresses (System.LearnFQDN, a bounded
// wait outside the actors); then the answer goes back to the pod from
// the server's address. It runs in the agent (not its own process) so
// that the hold is one front door call.
package dnsproxy
