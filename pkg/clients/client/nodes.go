package client

import (
	"context"
	"net/http"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// Nodes lists the remote nodes (GET /v1/nodes).
func (c *Client) Nodes(ctx context.Context) ([]models.Node, error) {
	var out []models.Node
	return out, c.do(ctx, http.MethodGet, "/v1/nodes", "", nil, &out)
}
