// Package fqdn tests DNS-aware policy end to end: an agent on the Linux
// datapath with its DNS proxy in a netns standing in for the node, a pod
// made by the real membrane-cni plugin (a test/nodeharness node), and a
// "world" netns holding a
// test DNS server (miekg/dns) and the servers its names point to. The
// pod's queries go through the BPF redirect to the proxy; toFQDNs allows
// what was resolved, until the TTL ends.
//
// The tests need root (netns, veths, BPF): they skip without it unless
// CI is set, and then fail.
package fqdn
