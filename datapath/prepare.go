package datapath

import (
	"context"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// Preparer is implemented by a datapath that can do part of an
// endpoint's first Realize ahead of it, while the agent writes the
// endpoint's state (the Linux datapath gives the endpoint its policy
// maps, a filled slot of the per-node outer maps; its programs are
// loaded once per node). Prepare changes nothing traffic
// sees, never fails (Realize does whatever Prepare did not) and may run
// at the same time as the endpoint's Realize or Remove.
type Preparer interface {
	Prepare(ctx context.Context, ep *endpoint.Endpoint)
}
