package models

// Node is one row of GET /v1/nodes: a remote node as one source reported
// it. Active says whether the datapath routes to this row (a node several
// sources report is taken from the source first by name).
type Node struct {
	Name      string   `json:"name"`
	Source    string   `json:"source"`
	Addresses []string `json:"addresses"`
	PodCIDRs  []string `json:"podCIDRs"`
	// HealthIPs are the node's health endpoint addresses this agent
	// accepted (inside the node's pod CIDRs) and probes.
	HealthIPs []string `json:"healthIPs,omitempty"`
	Active    bool     `json:"active"`
}
