package client

import (
	"context"
	"net/http"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// GCAttachment, GCRequest and GCResponse are POST /v1/gc's bodies.
type (
	GCAttachment = models.GCAttachment
	GCRequest    = models.GCRequest
	GCResponse   = models.GCResponse
)

// GC deletes every CNI endpoint whose attachment is not in valid, with
// its address and host veth.
func (c *Client) GC(ctx context.Context, valid []GCAttachment) (*GCResponse, error) {
	if valid == nil {
		valid = []GCAttachment{}
	}
	var r GCResponse
	return &r, c.do(ctx, http.MethodPost, "/v1/gc", "", &GCRequest{ValidAttachments: valid}, &r)
}
