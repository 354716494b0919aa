// Package proxy is the membrane-proxy process: a transparent HTTP proxy
// on the node that enforces each endpoint's HTTP rules per peer identity
// (403 otherwise), configured by the agent over xDS (its ADS client
// subscribes to the agent's l7proxy.Server and acknowledges each version
// it applied whole), and sending one access record per request to the
// agent. It matches and forwards one normalised path, refuses protocol
// upgrades and CONNECT, and accepts explicit (forward-proxy) requests on
// loopback only (SECURITY.md). The agent's half is package l7proxy; the
// wire types are package xdsapi.
package proxy
