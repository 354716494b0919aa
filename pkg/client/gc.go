package client

import (
	"context"
	"net/http"
)

// GCAttachment names one attachment the runtime still uses (CNI GC's
// cni.dev/valid-attachments).
type GCAttachment struct {
	ContainerID string `json:"container-id"`
	IfName      string `json:"ifname"`
}

// GCRequest is the body of POST /v1/gc.
type GCRequest struct {
	// ValidAttachments lists the attachments to keep; every CNI endpoint
	// (one with a netns and a container interface) not listed is deleted.
	ValidAttachments []GCAttachment `json:"valid-attachments"`
}

// GCResponse is the answer of POST /v1/gc.
type GCResponse struct {
	// Deleted are the IDs of the endpoints removed.
	Deleted []int64 `json:"deleted"`
}

// GC deletes every CNI endpoint whose attachment is not in valid, with
// its address and host veth.
func (c *Client) GC(ctx context.Context, valid []GCAttachment) (*GCResponse, error) {
	if valid == nil {
		valid = []GCAttachment{}
	}
	var r GCResponse
	return &r, c.do(ctx, http.MethodPost, "/v1/gc", nil, &GCRequest{ValidAttachments: valid}, &r)
}
