package api

import (
	"net/http"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// listNodes answers from the index: every (source, node) row.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, badRequest("GET /v1/nodes takes no query parameters"))
		return
	}
	rows := s.ix.Nodes()
	out := make([]models.Node, 0, len(rows))
	for _, n := range rows {
		m := models.Node{Name: n.Name, Source: n.Source, Active: n.Active,
			Addresses: make([]string, 0, len(n.Addrs)), PodCIDRs: make([]string, 0, len(n.PodCIDRs))}
		for _, a := range n.Addrs {
			m.Addresses = append(m.Addresses, a.String())
		}
		for _, p := range n.PodCIDRs {
			m.PodCIDRs = append(m.PodCIDRs, p.String())
		}
		for _, a := range n.HealthIPs {
			m.HealthIPs = append(m.HealthIPs, a.String())
		}
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
}
