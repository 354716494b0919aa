package messages

import (
	"context"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// DatapathWork asks the datapath worker pool actor to run one blocking
// operation (netlink, BPF, disk) on a worker goroutine. Reply:
// *DatapathResult, sent by the worker to the requester.
type DatapathWork struct {
	// Op names the operation for logs and metrics ("realize", "remove", ...).
	Op       string
	Endpoint endpoint.ID
	// Timeout bounds Run through its context; 0 means the pool's default.
	Timeout time.Duration
	Run     func(ctx context.Context) (any, error)
}

// DatapathResult answers DatapathWork.
type DatapathResult struct {
	Value any
	Err   error
	// Queued is how long the work waited for a worker; Ran how long it ran.
	Queued, Ran time.Duration
}
