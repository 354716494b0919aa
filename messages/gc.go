package messages

import "github.com/membrane-cni/membrane/datapath"

// StartGC turns the garbage collector actor's periodic passes on (the
// agent sends it once restore has rebuilt the index, so that restored
// endpoints are not mistaken for orphans). No reply.
type StartGC struct{}

// RunGC asks the garbage collector actor for one pass now (tests,
// operators). Reply: *GCResult once the pass and its deletions were
// requested.
type RunGC struct{}

// GCResult answers RunGC.
type GCResult struct {
	Report datapath.GCReport
	Err    error
}
