package api

import (
	"cmp"
	"context"
	"net/http"
	"slices"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
)

// listDrops answers GET /v1/drops: every endpoint's drop counters, read
// in the worker pool.
func (s *Server) listDrops(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, badRequest("GET /v1/drops takes no query parameters"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	out, err := s.readDrops(ctx, 0, true)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// readDrops reads the drop counters of endpoint id (all endpoints when
// all is set, each entry naming its endpoint) in the worker pool, sorted
// by endpoint, reason and direction.
func (s *Server) readDrops(ctx context.Context, id endpoint.ID, all bool) ([]models.DropCounter, error) {
	if all {
		id = 0
	}
	counters, err := s.sys.DropCounters(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]models.DropCounter, 0, len(counters))
	for k, c := range counters {
		dc := models.DropCounter{Reason: k.Reason, Direction: k.Dir.String(), Packets: c.Packets, Bytes: c.Bytes}
		if all {
			dc.Endpoint = int64(k.Endpoint)
		}
		out = append(out, dc)
	}
	slices.SortFunc(out, func(a, b models.DropCounter) int {
		return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(a.Reason, b.Reason), cmp.Compare(a.Direction, b.Direction))
	})
	return out, nil
}
