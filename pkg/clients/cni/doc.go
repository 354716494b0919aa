// Package cni is membrane-cni, the CNI plugin kubelet's container runtime
// executes: network-config and CNI_ARGS parsing, the pod side of the
// veth (created with its peer already in the pod's netns), the calls to
// the agent's REST API (IPAM, endpoints, GC, status) and the delete queue
// for DELs the agent could not take. The agent side of an endpoint (host
// veth settings, /32 route, gateway, teardown) is datapath.Linux's.
//
// The plugin is exec'd for every CNI call, so this package stays lean: no
// actor system, no agent packages, only the CNI library, netlink and the
// agent client (agentclient.go: a small HTTP/1.1 client, no net/http).
package cni
