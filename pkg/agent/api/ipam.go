package api

import (
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strconv"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

func (s *Server) allocateIP(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	for key := range q {
		if key != "family" && key != "owner" {
			return badRequest(fmt.Sprintf("unknown query parameter %q (want family, owner)", key))
		}
	}
	fam := ipam.Family(q.Get("family"))
	if fam != "" && fam != ipam.IPv4 && fam != ipam.IPv6 {
		return badRequest(fmt.Sprintf("query parameter \"family\": %q: want ipv4 or ipv6", fam))
	}
	if fam != "" && s.ranges[fam] == nil {
		return &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("query parameter \"family\": no %s range configured", fam)}
	}
	owner := q.Get("owner")
	if err := checkOwner(owner); err != nil {
		return err
	}
	got, err := s.sys.AllocateIP(r.Context(), fam, owner)
	if err != nil {
		return err
	}
	writeIPAM(w, http.StatusCreated, s.ipamResponse(got, owner))
	return nil
}

func (s *Server) ipamResponse(got actors.Allocation, owner string) *models.IPAMResponse {
	out := &models.IPAMResponse{Address: &models.AddressPair{}, HostAddressing: s.text.host}
	if t := s.text.ipv4; t != nil && got.IPv4.IsValid() {
		out.Address.IPv4 = got.IPv4.String()
		out.IPv4 = &models.IPAMAddressResponse{IP: out.Address.IPv4, Gateway: t.gateway, Cidrs: t.cidrs, Owner: owner}
	}
	if t := s.text.ipv6; t != nil && got.IPv6.IsValid() {
		out.Address.IPv6 = got.IPv6.String()
		out.IPv6 = &models.IPAMAddressResponse{IP: out.Address.IPv6, Gateway: t.gateway, Cidrs: t.cidrs, Owner: owner}
	}
	return out
}

// rangesText is the configured ranges' geometry as the answers spell
// it, built once: answers share it and only encode it, never modify it.
type rangesText struct {
	ipv4, ipv6 *rangeText
	host       *models.NodeAddressing
}

// rangeText is one range's gateway and CIDR.
type rangeText struct {
	gateway string
	cidrs   []string // the one CIDR
}

func newRangesText(ranges map[ipam.Family]*ipam.Range) rangesText {
	t := rangesText{host: &models.NodeAddressing{}}
	if r := ranges[ipam.IPv4]; r != nil {
		t.ipv4 = &rangeText{gateway: r.Gateway().String(), cidrs: []string{r.Prefix().String()}}
		t.host.IPv4 = &models.NodeAddressingElement{Enabled: true, IP: t.ipv4.gateway, AllocRange: t.ipv4.cidrs[0]}
	}
	if r := ranges[ipam.IPv6]; r != nil {
		t.ipv6 = &rangeText{gateway: r.Gateway().String(), cidrs: []string{r.Prefix().String()}}
		t.host.IPv6 = &models.NodeAddressingElement{Enabled: true, IP: t.ipv6.gateway, AllocRange: t.ipv6.cidrs[0]}
	}
	return t
}

func (s *Server) releaseIP(w http.ResponseWriter, r *http.Request) error {
	raw := r.PathValue("ip")
	ip, err := netip.ParseAddr(raw)
	if err != nil {
		return badRequest(fmt.Sprintf("path: %q is not an IP address", raw))
	}
	ip = ip.Unmap()
	fam := ipam.IPv4
	if ip.Is6() {
		fam = ipam.IPv6
	}
	if rg := s.ranges[fam]; rg == nil || !rg.Contains(ip) {
		return &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("address %s is outside the configured ranges", ip)}
	}
	owner := ""
	for key, vals := range r.URL.Query() {
		if key != "owner" {
			return badRequest(fmt.Sprintf("unknown query parameter %q (want owner)", key))
		}
		owner = vals[0]
	}
	if err := checkOwner(owner); err != nil {
		return err
	}
	got, err := s.sys.ReleaseIP(r.Context(), ip, owner)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"ip": ip.String(), "released": got.Released, "owner": got.Owner})
	return nil
}

func (s *Server) ipamStatus(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.ipamSnapshot(true))
}

// ipamSnapshot reads the ipam table (no mailbox involved).
func (s *Server) ipamSnapshot(withAllocations bool) *models.IPAMStatus {
	out := &models.IPAMStatus{}
	for _, fam := range []ipam.Family{ipam.IPv4, ipam.IPv6} {
		r := s.ranges[fam]
		if r == nil {
			continue
		}
		rows := s.ix.IPs(string(fam))
		st := &models.IPAMFamilyStatus{Cidr: r.Prefix().String(), Gateway: r.Gateway().String(), Size: r.Size(),
			Used: len(rows), Free: r.Size() - len(rows), Allocations: []models.IPAMAllocation{}}
		if withAllocations {
			for _, row := range rows {
				st.Allocations = append(st.Allocations, models.IPAMAllocation{IP: row.IP.String(), Owner: row.Owner, Endpoint: int64(row.Endpoint)})
			}
		}
		if fam == ipam.IPv4 {
			out.IPv4 = st
		} else {
			out.IPv6 = st
		}
	}
	return out
}

func (s *Server) identityModel(id identity.NumericIdentity) *models.Identity {
	if ls, ok := identity.ReservedLabels(id); ok {
		return &models.Identity{ID: int64(id), Labels: ls.Strings(), Reserved: true}
	}
	row, ok := s.ix.Identity(id)
	if !ok {
		if ls, ok := s.sys.NodeIdentities()[id]; ok {
			return nodeIdentityModel(id, ls)
		}
		return &models.Identity{ID: int64(id), Labels: []string{}}
	}
	return identityRowModel(row)
}

// nodeIdentityModel is a per-node identity as the API shows it.
func nodeIdentityModel(id identity.NumericIdentity, ls labels.Labels) *models.Identity {
	return &models.Identity{ID: int64(id), Labels: ls.Strings(), Scope: "node"}
}

// identityRowModel is an identities row as the API shows it.
func identityRowModel(row *index.Identity) *models.Identity {
	var scope string // the node-local allocator's rows have none
	switch {
	case row.Cluster && row.RefCount > 0:
		scope = "cluster"
	case row.Cluster:
		scope = "remote"
	}
	return &models.Identity{ID: int64(row.ID), Labels: row.Labels.Strings(), RefCount: row.RefCount, Scope: scope}
}

func (s *Server) listIdentities(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, badRequest("GET /v1/identity takes no query parameters"))
		return
	}
	var out []*models.Identity
	for _, id := range []identity.NumericIdentity{identity.ReservedHost, identity.ReservedWorld, identity.ReservedUnmanaged, identity.ReservedHealth, identity.ReservedInit, identity.ReservedRemoteNode, identity.ReservedKubeAPIServer, identity.ReservedIngress} {
		out = append(out, s.identityModel(id))
	}
	for _, row := range s.ix.Identities() {
		out = append(out, identityRowModel(row))
	}
	nodes := s.sys.NodeIdentities()
	for _, id := range slices.Sorted(maps.Keys(nodes)) {
		out = append(out, nodeIdentityModel(id, nodes[id]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getIdentity(w http.ResponseWriter, r *http.Request) {
	raw := r.PathValue("id")
	n, err := strconv.ParseUint(raw, 10, 32)
	if err != nil || n == 0 {
		writeError(w, badRequest(fmt.Sprintf("identity %q: want a positive number", raw)))
		return
	}
	id := identity.NumericIdentity(n)
	if _, ok := identity.ReservedLabels(id); !ok {
		_, isNode := s.sys.NodeIdentities()[id]
		if _, ok := s.ix.Identity(id); !ok && !isNode {
			writeError(w, notFound(fmt.Sprintf("identity %d not found", id)))
			return
		}
	}
	writeJSON(w, http.StatusOK, s.identityModel(id))
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// localHealth is the health endpoint's status with the node probes'
// summary (nil before SetHealth).
func (s *Server) localHealth() *models.HealthStatus {
	fn := s.health.Load()
	if fn == nil {
		return nil
	}
	st := (*fn)()
	if st == nil {
		return nil
	}
	for _, n := range s.nodeMatrix() {
		st.NodesProbed++
		if n.State != "ok" {
			st.FailingNodes = append(st.FailingNodes, n.Name)
		}
	}
	return st
}

// nodeMatrix is every remote node's reachability (none without probes).
func (s *Server) nodeMatrix() []models.NodeHealth {
	if fn := s.nodeHealth.Load(); fn != nil {
		return (*fn)()
	}
	return []models.NodeHealth{}
}

// healthReport answers GET /v1/health.
func (s *Server) healthReport(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, &models.HealthReport{Local: s.localHealth(), Nodes: s.nodeMatrix()})
}

func (s *Server) status(w http.ResponseWriter, _ *http.Request) {
	total, byState := s.ix.CountEndpoints()
	st := &models.Status{State: "ok", Version: s.cfg.Version, Datapath: s.sys.Datapath.Name(), Endpoints: total,
		Ready: byState["ready"], Identities: len(s.ix.Identities()), IPAM: s.ipamSnapshot(false), Started: s.started}
	st.Health = s.localHealth()
	st.Restore = s.restore.Load()
	if fn := s.k8s.Load(); fn != nil {
		st.K8s = (*fn)()
	}
	if fn := s.kvstore.Load(); fn != nil {
		st.Kvstore = (*fn)()
	}
	if fn := s.stateDir.Load(); fn != nil {
		st.StateDir = (*fn)()
	}
	st.L7Proxy = l7Status(s.sys.Datapath)
	if fl := s.flowLog.Load(); fl != nil {
		fs := fl.Stats()
		st.Flows = &fs
	}
	st.BPFPins = pinStatus(s.sys.Datapath)
	if ci, ok := s.sys.ClusterIdentities(); ok {
		st.ClusterIdentity = &models.ClusterIdentityStatus{Backend: ci.Store.Backend, Healthy: ci.Store.Healthy, Since: ci.Store.Since,
			Synced: ci.Store.Synced, Known: ci.Known, InUse: ci.InUse, Waiting: ci.Waiting, WaitingLabels: ci.WaitingLabels, LastError: ci.Store.LastError}
		if ci.LastError != "" {
			st.ClusterIdentity.LastError = ci.LastError
		}
	}
	status := http.StatusOK
	// A 503 body is the status and the API's error shape at once.
	switch {
	case s.closing.Load():
		st.State, st.Message, status = "stopping", "agent is shutting down", http.StatusServiceUnavailable
		st.Code = CodeShuttingDown
	case !s.ready.Load():
		st.State, st.Message, status = "starting", "restoring endpoints", http.StatusServiceUnavailable
		st.Code = CodeStarting
	}
	writeJSON(w, status, st)
}

// pinStatus is the datapath's check of its BPF pins for GET /v1/status
// (nil when the datapath pins nothing).
func pinStatus(dp datapath.Datapath) *models.BPFPinsStatus {
	r, ok := dp.(datapath.PinStatusReader)
	if !ok {
		return nil
	}
	ps := r.PinStatus()
	st := &models.BPFPinsStatus{Path: ps.Dir, Healthy: ps.Healthy, Repairs: ps.Repairs, Repinned: ps.Repinned, LastRepair: ps.LastAt}
	if ps.Repairs > 0 {
		st.LastMessage = ps.Last.Summary()
	}
	return st
}

// l7Status is the datapath's L7 proxy state for GET /v1/status (nil when
// the datapath has none or L7 is off).
func l7Status(dp datapath.Datapath) *models.L7ProxyStatus {
	r, ok := dp.(datapath.L7StatusReader)
	if !ok {
		return nil
	}
	st := r.L7Status()
	if st == nil {
		return nil
	}
	out := &models.L7ProxyStatus{PID: st.Process.PID, Restarts: st.Process.Restarts, LastExit: st.Process.LastExit,
		Version: st.Version, Acked: st.Acks.Acked, Pending: st.Acks.Pending, Nacks: st.Acks.Nacks, LastNack: st.Acks.LastNack, Port: st.Port}
	for _, e := range st.Acks.Endpoints {
		out.Endpoints = append(out.Endpoints, models.L7EndpointVersion{ID: int64(e.Endpoint), Version: e.Version, Acked: e.Acked})
	}
	return out
}
