// Package datapath is the only package that touches the kernel. It defines
// the Datapath interface the agent's actors drive (always from the bounded
// worker pool, never from inside an actor's Receive) and a Fake that runs
// anywhere, in memory, with hooks to inject errors, delays and proxy
// acknowledgement behaviour. The Linux implementation (netlink, network
// namespaces, veths, eBPF programs) lives in *_linux.go files. Every
// operation is idempotent: realising twice changes nothing, removing a
// missing endpoint is success.
package datapath
