// Package l7 tests L7 (HTTP) policy end to end: an agent on the Linux
// datapath running the real membrane-proxy process, pods made by the
// real membrane-cni plugin (a test/nodeharness node), policies imported through
// PUT /v1/policy, and real HTTP traffic the BPF programs redirect to the
// proxy transparently. It checks verdicts (200 from the server, 403
// from the proxy, drops), the proxy's restart, the proxy-completion
// waits (acknowledged, timed out, rejected, a delete during a wait) as
// operators see them (endpoint state, events, /metrics, GET /v1/actors,
// the endpoint's policy view), and measures (bench_linux_test.go).
//
// The tests need root (netns, veths, BPF): they skip without it unless
// CI is set, and then fail.
package l7
