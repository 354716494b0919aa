package messages

import "github.com/membrane-cni/membrane/datapath"

// SyncNodes gives the nodes actor the full set of remote nodes Source
// knows (an empty set: the source knows none). Reply: *NodesResult, once
// the set is in the index (the datapath follows asynchronously).
type SyncNodes struct {
	Source string
	Nodes  []datapath.RemoteNode
}

// NodesResult answers SyncNodes.
type NodesResult struct {
	Err error
}
