// Package api serves Membrane's REST API (base path /v1) on the agent's
// unix socket. Mutating calls become messages to the actor system;
// reads open go-memdb read transactions on the index directly and never
// go through a mailbox. Every error is JSON {code, message} with an HTTP
// status that tells what happened (see errors.go). Mutating calls are
// refused with 503 until the agent is ready (restore finished) and are
// bounded by an in-flight limit that applies back-pressure to clients.
package api
