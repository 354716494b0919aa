// Package metrics owns the agent's Prometheus metrics: API latency by
// route and code, regeneration duration by phase (observed by the
// actors), and gauges sampled at scrape time from the index and the actor
// registry (endpoints by state, mailbox depth, IPAM used and free,
// identities, delete-queue length) plus the last restore's duration. It
// uses its own registry, never the global one.
package metrics
