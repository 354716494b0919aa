package api

import (
	"net/http"
	"strconv"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// listServices answers GET /v1/service from the index; with
// ?maps=true it reads the BPF service maps back (in the pool) and adds
// what they hold per frontend.
func (s *Server) listServices(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	maps := false
	for k, v := range q {
		if k != "maps" || len(v) != 1 {
			writeError(w, badRequest("GET /v1/service takes only ?maps=true|false"))
			return
		}
		b, err := strconv.ParseBool(v[0])
		if err != nil {
			writeError(w, badRequest("maps: want true or false"))
			return
		}
		maps = b
	}
	rows := s.ix.Services()
	out := models.ServiceList{Services: make([]models.Service, 0, len(rows))}
	for _, row := range rows {
		out.Services = append(out.Services, serviceModel(row))
	}
	if maps {
		m, err := s.sys.DumpServiceMaps(r.Context())
		if err != nil {
			out.MapsError = err.Error()
		} else {
			out.Maps = addRealized(out.Services, rows, m)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func serviceModel(row *index.ServiceRow) models.Service {
	m := models.Service{Frontend: row.Service.Frontend.String(), Name: row.Service.Name, PortName: row.Service.PortName,
		Kind: row.Service.Kind, Source: row.Source, ID: row.ID, Backends: make([]string, 0, len(row.Service.Backends)),
		AffinitySeconds: int64(row.Service.Affinity.Seconds()), State: row.State, Error: row.Error}
	for _, b := range row.Service.Backends {
		m.Backends = append(m.Backends, b.String())
	}
	return m
}

// addRealized sets each service's Realized from the maps and counts them.
func addRealized(out []models.Service, rows []*index.ServiceRow, m datapath.LBMaps) *models.ServiceMapCounts {
	byID, localByID := map[uint32][]string{}, map[uint32][]string{}
	for _, b := range m.Backends {
		byID[b.ID] = append(byID[b.ID], b.Backend.String()) // slot order: sorted
		if b.Backend.Local {
			localByID[b.ID] = append(localByID[b.ID], b.Backend.String())
		}
	}
	held := map[service.Frontend]datapath.LBFrontendEntry{}
	for _, fe := range m.Frontends {
		held[fe.Frontend] = fe
	}
	counts := &models.ServiceMapCounts{Frontends: len(m.Frontends), Backends: len(m.Backends),
		Connections: m.Connections, ReverseNAT: m.ReverseNAT, Affinity: m.Affinity,
		NodePortNAT: m.NodePortNAT, NodePortSNAT: m.NodePortSNAT, Sockets: m.Sockets,
		Hooks: models.ServiceHooks{KubeProxyReplacement: m.Hooks.KubeProxyReplacement, Cgroup: m.Hooks.Cgroup,
			SocketPrograms: m.Hooks.SocketPrograms, Devices: m.Hooks.Devices}}
	inTable := map[service.Frontend]bool{}
	for i, row := range rows {
		f := row.Service.Frontend
		inTable[f] = true
		fe, ok := held[f]
		if !ok {
			continue
		}
		bs := byID[fe.ID]
		if len(bs) > int(fe.Count) {
			bs = bs[:fe.Count]
		}
		out[i].Realized = &models.ServiceRealized{ID: fe.ID, Backends: append([]string{}, bs...), AffinitySeconds: fe.Affinity,
			External: fe.External, Local: localByID[fe.ID]}
	}
	for _, fe := range m.Frontends {
		if !inTable[fe.Frontend] {
			counts.Orphans = append(counts.Orphans, fe.Frontend.String())
		}
	}
	return counts
}
