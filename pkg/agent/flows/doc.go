// Package flows owns the agent's flow log, Hubble's idea on one node: the
// endpoint programs' flow reports (one per new connection, with its
// verdict) and drop notifications, enriched with both sides' pods,
// namespaces, labels and identities, the node, the Service frontend, the
// policies behind the verdict where the agent can tell, and the L7 or DNS
// record of a proxied connection; kept in a bounded ring (Store) that GET
// /v1/flows queries with filters (Filter, ParseFilter) and follows.
//
// Every loss is counted: flows the kernel could not write (its ring was
// full: datapath counters), flows over the rate limit, flows a slow
// follower missed (the follower is dropped, never waited for). Nothing
// here blocks the ring-buffer readers that feed it, nor an actor: the
// enrichment reads the index (go-memdb read transactions).
package flows
