// Package models holds the JSON bodies of Membrane's REST API (base path
// /v1 on the agent's unix socket). Field names follow Cilium's API models
// (EndpointChangeRequest, IPAMResponse, ...) so that habits and tooling carry
// over. The package has no behaviour beyond decoding helpers; the server lives
// in pkg/agent/api and the Go client in pkg/clients/client.
package models
