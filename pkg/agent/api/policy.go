package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// maxPolicyBody bounds a PUT /v1/policy body.
const maxPolicyBody = 8 << 20

// CodeInvalidPolicy is the code of a policy document that does not parse.
const CodeInvalidPolicy = "invalid-policy" // 400

// putPolicy imports YAML or JSON policy documents, all or nothing.
func (s *Server) putPolicy(w http.ResponseWriter, r *http.Request) error {
	if len(r.URL.Query()) > 0 {
		return badRequest("PUT /v1/policy takes no query parameters")
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxPolicyBody+1))
	if err != nil {
		return badRequest("reading body: " + err.Error())
	}
	if len(body) > maxPolicyBody {
		return &apiError{http.StatusRequestEntityTooLarge, CodeRequestTooLarge, fmt.Sprintf("body larger than %d bytes", maxPolicyBody)}
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, _ := mime.ParseMediaType(ct)
		trimmed := strings.TrimSpace(string(body))
		if mt == "application/json" && !strings.HasPrefix(trimmed, "{") && !strings.HasPrefix(trimmed, "[") {
			return &apiError{http.StatusBadRequest, CodeInvalidPolicy, "Content-Type is application/json but the body is not a JSON object or list"}
		}
	}
	pols, err := policy.ParseWith(body, policy.ParseOptions{NodeSelectorLabels: s.sys.Config.NodeSelectorLabels,
		SecretsNamespace: s.sys.Config.PolicySecretsNamespace})
	if err != nil {
		return &apiError{http.StatusBadRequest, CodeInvalidPolicy, err.Error()}
	}
	res, err := s.sys.ImportPolicy(r.Context(), pols)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &models.PolicyImportResponse{Revision: res.Revision, Policies: res.Names})
	return nil
}

// listPolicies answers from the index.
func (s *Server) listPolicies(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, badRequest("GET /v1/policy takes no query parameters"))
		return
	}
	rows := s.ix.Policies()
	out := &models.PolicyList{Revision: s.ix.PolicyRevisionNow(), Policies: make([]*models.Policy, 0, len(rows))}
	for _, row := range rows {
		p := row.Policy
		labels := p.Labels
		if labels == nil {
			labels = map[string]string{}
		}
		out.Policies = append(out.Policies, &models.Policy{Name: p.Name, Namespace: p.Namespace, Kind: p.Kind, Labels: labels, Spec: p.Spec,
			Selected: selectionsModel(row.Selected)})
	}
	writeJSON(w, http.StatusOK, out)
}

func selectionsModel(sels []policy.Selection) []models.PolicySelection {
	if len(sels) == 0 {
		return nil
	}
	out := make([]models.PolicySelection, len(sels))
	for i, s := range sels {
		m := models.PolicySelection{Selector: s.Selector, Identities: make([]uint32, len(s.Identities))}
		for j, id := range s.Identities {
			m.Identities[j] = uint32(id)
		}
		for _, svc := range s.Services {
			ms := models.PolicySelectedService{Namespace: svc.Namespace, Name: svc.Name, Selector: svc.Selector}
			for _, a := range svc.Addrs {
				ms.Addresses = append(ms.Addresses, a.String())
			}
			m.Services = append(m.Services, ms)
		}
		out[i] = m
	}
	return out
}

// deletePolicy deletes by ?name=ns/name or ?labels=k=v,...
func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request) error {
	name, lbls, err := policyDeleteQuery(r.URL.Query())
	if err != nil {
		return err
	}
	res, err := s.sys.DeletePolicy(r.Context(), name, lbls)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &models.PolicyDeleteResponse{Revision: res.Revision, Deleted: res.Deleted})
	return nil
}

// policyDeleteQuery returns the name or the labels DELETE /policy names.
func policyDeleteQuery(q url.Values) (name string, lbls map[string]string, err error) {
	for k := range q {
		if k != "name" && k != "labels" {
			return "", nil, badRequest(fmt.Sprintf("unknown query parameter %q (want name or labels)", k))
		}
	}
	name, sel := q.Get("name"), q.Get("labels")
	switch {
	case (name == "") == (sel == ""):
		return "", nil, badRequest("give exactly one of the query parameters name (namespace/name) or labels (k=v,...)")
	case name != "":
		if !strings.Contains(name, "/") {
			name = policy.DefaultNamespace + "/" + name
		}
		return name, nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(sel, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", nil, badRequest(fmt.Sprintf("query parameter labels: %q is not key=value", kv))
		}
		m[k] = v
	}
	return "", m, nil
}

// getEndpointPolicy answers the computed policy (from the index) and the
// realised one (read back through the worker pool).
func (s *Server) getEndpointPolicy(w http.ResponseWriter, r *http.Request) {
	ep, err := s.resolve(r)
	if err != nil {
		writeError(w, err)
		return
	}
	out := &models.EndpointPolicy{ID: int64(ep.ID), Identity: uint32(ep.Identity), Computed: []models.PolicyEntry{},
		ComputedCIDR: []models.CIDRPolicyEntry{}}
	if m := ep.Policy; m != nil {
		out.PolicyRevision, out.IngressEnforced, out.EgressEnforced = m.Revision, m.IngressEnforced, m.EgressEnforced
		for _, k := range m.Allow {
			out.Computed = append(out.Computed, entryModel(k, m.Denies(k)))
		}
		for _, c := range m.CIDR {
			out.ComputedCIDR = append(out.ComputedCIDR, cidrEntryModel(c))
		}
		for _, e := range m.L7 {
			l7 := models.L7PolicyEntry{PolicyEntry: entryModel(e.Key, false), HTTP: make([]models.HTTPRule, 0, len(e.HTTP))}
			for _, h := range e.HTTP {
				r := models.HTTPRule{Method: h.Method, Path: h.Path, Host: h.Host, Headers: h.Headers}
				for _, m := range h.HeaderMatches {
					hm := models.HeaderMatch{Name: m.Name, Value: m.Value, Mismatch: m.Mismatch}
					if m.Secret != nil {
						hm.Secret = m.Secret.String() // the reference; the agent's policy never holds the value
					}
					r.HeaderMatches = append(r.HeaderMatches, hm)
				}
				l7.HTTP = append(l7.HTTP, r)
			}
			for _, k := range e.Kafka {
				l7.Kafka = append(l7.Kafka, models.KafkaRule(k))
			}
			out.ComputedL7 = append(out.ComputedL7, l7)
		}
		for _, e := range m.DNS {
			d := models.DNSPolicyEntry{PolicyEntry: entryModel(e.Key, false), Names: make([]string, 0, len(e.Names))}
			for _, n := range e.Names {
				d.Names = append(d.Names, n.String())
			}
			out.ComputedDNS = append(out.ComputedDNS, d)
		}
	}
	if st := l7Status(s.sys.Datapath); st != nil {
		for _, e := range st.Endpoints {
			if e.ID == int64(ep.ID) {
				out.L7Proxy = &e
			}
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
	defer cancel()
	pd, err := s.dumpPolicy(ctx, ep.ID)
	if err != nil {
		out.RealizedError = err.Error()
	} else {
		out.Realized = make([]models.RealizedPolicyEntry, 0, len(pd.entries))
		for _, e := range pd.entries {
			out.Realized = append(out.Realized, models.RealizedPolicyEntry{PolicyEntry: entryModel(e.Key, e.Deny), Packets: e.Packets, Bytes: e.Bytes, ProxyPort: e.ProxyPort})
		}
		out.RealizedCIDR = make([]models.RealizedCIDRPolicyEntry, 0, len(pd.cidr))
		for _, e := range pd.cidr {
			out.RealizedCIDR = append(out.RealizedCIDR, models.RealizedCIDRPolicyEntry{CIDRPolicyEntry: cidrEntryModel(e.Entry), Packets: e.Packets, Bytes: e.Bytes})
		}
		out.RealizedIngressEnforced, out.RealizedEgressEnforced = pd.ingress, pd.egress
	}
	if out.Drops, err = s.readDrops(ctx, ep.ID, false); err != nil {
		out.DropsError = err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}

// policyDump is an endpoint's policy maps as the datapath holds them.
type policyDump struct {
	entries         []datapath.PolicyEntry
	cidr            []datapath.CIDRPolicyEntry
	ingress, egress bool
}

// dumpPolicy reads an endpoint's policy maps back from the datapath.
func (s *Server) dumpPolicy(ctx context.Context, id endpoint.ID) (*policyDump, error) {
	rp, err := s.sys.DumpPolicy(ctx, id)
	if err != nil {
		return nil, err
	}
	return &policyDump{entries: rp.Entries, cidr: rp.CIDR, ingress: rp.Ingress, egress: rp.Egress}, nil
}

func entryModel(k policy.Key, deny bool) models.PolicyEntry {
	port, icmp := portModel(k.Proto, k.Port)
	return models.PolicyEntry{Identity: uint32(k.Identity), Port: port, ICMPType: icmp, Protocol: policy.ProtoName(k.Proto),
		Direction: k.Dir.String(), Deny: deny}
}

func cidrEntryModel(e policy.CIDREntry) models.CIDRPolicyEntry {
	port, icmp := portModel(e.Proto, e.Port)
	return models.CIDRPolicyEntry{CIDR: e.Prefix.String(), Port: port, ICMPType: icmp, Protocol: policy.ProtoName(e.Proto),
		Direction: e.Dir.String(), Deny: e.Deny, Allow: e.Allow}
}

// portModel splits an entry's port into the port and, for ICMP, the
// type it matches (policy.ICMPTypePort), in decimal.
func portModel(proto uint8, port uint16) (uint16, string) {
	if (proto != policy.ProtoICMP && proto != policy.ProtoICMPv6) || port == 0 {
		return port, ""
	}
	return 0, strconv.Itoa(int(uint8(port)))
}

// listIPCache answers from the index.
func (s *Server) listIPCache(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.Query()) > 0 {
		writeError(w, badRequest("GET /v1/ipcache takes no query parameters"))
		return
	}
	rows := s.ix.IPCache()
	out := make([]models.IPCacheEntry, 0, len(rows))
	for _, e := range rows {
		out = append(out, models.IPCacheEntry{CIDR: e.Prefix.String(), Identity: uint32(e.Identity), Source: e.Source})
	}
	writeJSON(w, http.StatusOK, out)
}

// isPolicyNotFound reports a delete by name that matched nothing.
func isPolicyNotFound(err error) bool { return errors.Is(err, policy.ErrNotFound) }
