// Package cluster is membranectl's view of a whole cluster through the
// Kubernetes API server: every node's agent reached by running its own
// membranectl inside the agent pod (pods/exec, as kubectl exec does), and
// the connectivity test, which deploys its own pods into a namespace and
// checks what a working CNI must do.
//
// The agents are reached through the API server rather than a port of
// their own: the API server already authenticates the operator and RBAC
// decides who may exec into kube-system-like namespaces, so no agent
// listens on the network for this and no new credential exists. The
// cost is one exec stream per node per request, acceptable for an
// operator's command (not for a metrics scraper, which reads each agent's
// /metrics instead).
package cluster
