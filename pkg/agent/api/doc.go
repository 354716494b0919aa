// Package api serves Membrane's REST API (base path /v1) on the agent's
// unix socket. Mutating calls become messages to the actor system;
// reads open go-memdb read transactions on the index directly and never
// go through a mailbox. Every error is JSON {code, message} with an HTTP
// status that tells what happened (see errors.go). Mutating calls are
// refused with 503 until the agent is ready (restore finished) and are
// bounded by an in-flight limit that applies back-pressure to clients.
//
// How it works (ARCHITECTURE.md has the map):
//
// `pkg/agent/api` — the REST server (routes in `server.go`, strict
// decoding and validation in `decode.go`, error codes in `errors.go`,
// endpoint answers hand-encoded from the index record in
// `endpoint_json.go` (`endpoint_model.go` is the record's wire form), POST
// /v1/ipam's in `ipam_json.go`, POST /v1/attach (the CNI ADD, its netlink
// work through `datapath/podnet` on the request's goroutine) in
// `attach.go`; operator surfaces: `actors.go` + `actors_json.go`
// (hand-encoded tree), `events.go` (SSE), `drops.go`, `metrics.go`
// (/metrics, pprof, latency middleware, the read-only handler of
// `--http-addr`)). Handlers read the index and call the front door; they
// hold no PID and build no kernel closure.
//
// The TCP listener cannot change anything. `--http-addr` serves only
// GET/HEAD; every other method, and any `Host` that is neither loopback
// nor allowed (DNS rebinding), is refused before routing.
//
// No client can hold the socket. Each listener has its own connection cap
// (`api.LimitListener`: over the cap, 503 and close), so the TCP
// listener's clients never take the socket's descriptors; a mutating
// call's body is read under a deadline before it takes an in-flight slot;
// every answer and every event batch has a write deadline, and Shutdown
// moves the streams' deadlines to now.
//
// Bad input is refused, never repaired. Path, query and body must be valid
// UTF-8 and the path canonical; every field is checked in `pkg/agent/api`
// (`decode.go`, `validate.go`) before it reaches an actor, a path or a
// label set; reserved labels come only from the agent.
package api
