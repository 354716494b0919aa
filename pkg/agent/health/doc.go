// Package health runs the agent's health endpoint, as Cilium's
// cilium-health does: an endpoint with its own network namespace and the
// reserved identity health (labels reserved:health), whose address
// answers ICMP echo (the kernel) and HTTP (a responder on a socket made
// inside the namespace). The agent probes it from the host netns
// periodically and reports the result in GET /v1/status.
//
// Its address survives agent restarts: it is recorded in
// <state-dir>/health/health.json; at start the restored health endpoint
// of the previous agent is deleted with NoIPRelease and replaced by a new
// one holding the same address. Kernel work goes through the datapath
// (datapath.HealthDatapath): creating and deleting the namespace and veth
// runs in the worker pool; the responder's listener and the probes' dials
// (sockets opened on a thread inside a namespace) are made by the health
// goroutine, which never runs inside an actor.
package health
