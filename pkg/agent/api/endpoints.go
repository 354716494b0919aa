package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// parseRef parses the {id} path element; pod-name:<ns>/<pod> may arrive
// with its '/' escaped (one segment) or not ({id}/{pod}).
func parseRef(r *http.Request) (endpoint.Ref, error) {
	raw := r.PathValue("id")
	if pod := r.PathValue("pod"); pod != "" {
		if !strings.HasPrefix(raw, "pod-name:") {
			return endpoint.Ref{}, notFound(fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
		}
		raw += "/" + pod
	}
	ref, err := endpoint.ParseRef(raw)
	if err != nil {
		return ref, badRequest(err.Error())
	}
	return ref, nil
}

// resolve finds the endpoint a path reference names, or a 404.
func (s *Server) resolve(r *http.Request) (*endpoint.Endpoint, error) {
	ref, err := parseRef(r)
	if err != nil {
		return nil, err
	}
	ep, ok := s.ix.Resolve(ref)
	if !ok {
		return nil, notFound(fmt.Sprintf("endpoint %s not found", ref))
	}
	return ep, nil
}

// model converts an index record, attaching its identity's labels.
func (s *Server) model(ep *endpoint.Endpoint) *models.Endpoint {
	var ident *models.Identity
	if ep.Identity != identity.IdentityUnknown {
		ident = s.identityModel(ep.Identity)
	}
	return endpointModel(ep, ident)
}

// endpointResult maps the front door's answer: an endpoint whose actor
// stopped between the lookup and the request is gone.
func endpointResult(ep *endpoint.Endpoint, err error) (*endpoint.Endpoint, error) {
	if errors.Is(err, actors.ErrEndpointGone) {
		return nil, notFound("endpoint is gone")
	}
	return ep, err
}

func (s *Server) putEndpoint(w http.ResponseWriter, r *http.Request) error {
	ref, err := parseRef(r)
	if err != nil {
		return err
	}
	var req models.EndpointChangeRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	sync, err := syncParam(r.URL.Query())
	if err != nil {
		return err
	}
	spec, err := specFromRequest(ref, &req)
	if err != nil {
		return err
	}
	if err := s.checkRanges(spec); err != nil {
		return err
	}
	if fn := s.labeler.Load(); fn != nil && spec.PodName != "" {
		if spec.Labels, spec.NamedPorts, err = (*fn)(r.Context(), spec); err != nil {
			return fmt.Errorf("labels of pod %s/%s: %w", spec.Namespace, spec.PodName, err)
		}
	}
	ep, err := endpointResult(s.sys.CreateEndpoint(r.Context(), spec, req.SyncBuild || sync))
	if err != nil {
		return err
	}
	s.writeEndpoint(w, http.StatusCreated, ep)
	return nil
}

// syncParam reads PUT's optional ?sync=true (the body's sync-build does
// the same).
func syncParam(q url.Values) (bool, error) {
	sync := false
	for key, vals := range q {
		if key != "sync" {
			return false, badRequest(fmt.Sprintf("unknown query parameter %q (want sync)", key))
		}
		b, err := strconv.ParseBool(vals[0])
		if err != nil {
			return false, badRequest(fmt.Sprintf("query parameter \"sync\": %q is not a boolean", vals[0]))
		}
		sync = b
	}
	return sync, nil
}

func (s *Server) getEndpoint(w http.ResponseWriter, r *http.Request) {
	ep, err := s.resolve(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.writeEndpoint(w, http.StatusOK, ep)
}

// page is the pagination of GET /v1/endpoint: at most limit endpoints
// with IDs above after (limit 0: all).
type page struct {
	limit int
	after endpoint.ID
}

// maxPage bounds ?limit=.
const maxPage = 10000

// endpointFilterFrom parses GET /v1/endpoint's query; unknown parameters
// are refused so that a typo does not silently list everything.
func endpointFilterFrom(q url.Values) (index.EndpointFilter, page, error) {
	var f index.EndpointFilter
	var pg page
	for key, vals := range q {
		switch key {
		case "namespace", "pod", "state", "identity", "label":
			if err := endpointFilterKey(&f, key, vals); err != nil {
				return f, pg, err
			}
		case "ip":
			ip, err := netip.ParseAddr(vals[0])
			if err != nil {
				return f, pg, badRequest(fmt.Sprintf("query parameter \"ip\": %q is not an IP address", vals[0]))
			}
			f.IP = ip.Unmap()
		case "selector":
			sel, err := labels.ParseSelector(strings.Join(vals, ","))
			if err != nil {
				return f, pg, badRequest(fmt.Sprintf("query parameter \"selector\": %v", err))
			}
			f.Selector = sel
		case "limit":
			n, err := strconv.Atoi(vals[0])
			if err != nil || n < 1 || n > maxPage {
				return f, pg, badRequest(fmt.Sprintf("query parameter \"limit\": %q is not a number in 1..%d", vals[0], maxPage))
			}
			pg.limit = n
		case "after":
			n, err := strconv.ParseUint(vals[0], 10, 16)
			if err != nil {
				return f, pg, badRequest(fmt.Sprintf("query parameter \"after\": %q is not an endpoint ID", vals[0]))
			}
			pg.after = endpoint.ID(n)
		default:
			return f, pg, badRequest(fmt.Sprintf("unknown query parameter %q (want namespace, pod, state, identity, label, selector, ip, limit, after)", key))
		}
	}
	if f.PodName != "" && f.Namespace == "" {
		return f, pg, badRequest("query parameter \"pod\" needs \"namespace\"")
	}
	return f, pg, nil
}

// endpointFilterKey parses one of the original filters.
func endpointFilterKey(f *index.EndpointFilter, key string, vals []string) error {
	switch key {
	case "namespace":
		f.Namespace = vals[0]
	case "pod":
		f.PodName = vals[0]
	case "state":
		st, err := endpoint.ParseState(vals[0])
		if err != nil {
			return badRequest(fmt.Sprintf("query parameter \"state\": %v", err))
		}
		f.State = st
	case "identity":
		n, err := strconv.ParseUint(vals[0], 10, 32)
		if err != nil || n == 0 {
			return badRequest(fmt.Sprintf("query parameter \"identity\": %q is not a positive number", vals[0]))
		}
		f.Identity = identity.NumericIdentity(n)
	case "label":
		ls, err := labels.ParseSet(vals)
		if err != nil {
			return badRequest(fmt.Sprintf("query parameter \"label\": %v", err))
		}
		f.Labels = ls
	}
	return nil
}

func (s *Server) listEndpoints(w http.ResponseWriter, r *http.Request) {
	f, pg, err := endpointFilterFrom(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	eps := s.ix.Endpoints(f)
	w.Header().Set("X-Total-Count", strconv.Itoa(len(eps)))
	if pg.after > 0 {
		i, _ := slices.BinarySearchFunc(eps, pg.after+1, func(ep *endpoint.Endpoint, id endpoint.ID) int { return int(ep.ID) - int(id) })
		eps = eps[i:]
	}
	if pg.limit > 0 && len(eps) > pg.limit {
		eps = eps[:pg.limit]
		q := r.URL.Query()
		q.Set("after", strconv.Itoa(int(eps[len(eps)-1].ID)))
		w.Header().Set("Link", fmt.Sprintf("</v1/endpoint?%s>; rel=\"next\"", q.Encode()))
	}
	s.writeEndpoints(w, eps)
}

func deleteOptions(q url.Values) (endpoint.DeleteOptions, error) {
	var o endpoint.DeleteOptions
	for key, vals := range q {
		b, err := strconv.ParseBool(vals[0])
		switch {
		case key != "no-ip-release" && key != "no-identity-release":
			return o, badRequest(fmt.Sprintf("unknown query parameter %q (want no-ip-release, no-identity-release)", key))
		case err != nil:
			return o, badRequest(fmt.Sprintf("query parameter %q: %q is not a boolean", key, vals[0]))
		case key == "no-ip-release":
			o.NoIPRelease = b
		default:
			o.NoIdentityRelease = b
		}
	}
	return o, nil
}

func (s *Server) deleteEndpoint(w http.ResponseWriter, r *http.Request) error {
	opts, err := deleteOptions(r.URL.Query())
	if err != nil {
		return err
	}
	ep, err := s.resolve(r)
	if err != nil {
		return err
	}
	gone, err := endpointResult(s.sys.DeleteEndpoint(r.Context(), ep.ID, opts))
	if err == nil {
		s.syncHostPortsAfter(r.Context(), ep)
	}
	if err != nil {
		return err
	}
	s.writeEndpoint(w, http.StatusOK, gone)
	return nil
}

// attachmentEndpoints are the endpoints of container containerID with
// interface ifName ("": every attachment of the container).
func (s *Server) attachmentEndpoints(containerID, ifName string) []*endpoint.Endpoint {
	var eps []*endpoint.Endpoint
	for _, ep := range s.ix.EndpointsByContainerID(containerID) {
		if ifName == "" || ep.ContainerInterfaceName == ifName {
			eps = append(eps, ep)
		}
	}
	return eps
}

func (s *Server) deleteEndpointBatch(w http.ResponseWriter, r *http.Request) error {
	var req models.EndpointBatchDeleteRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	if req.ContainerID == "" {
		return badRequest("field \"container-id\": required")
	}
	if req.ContainerInterfaceName != "" && !ifname.Valid(req.ContainerInterfaceName) {
		return badRequest(fmt.Sprintf("field \"container-interface-name\": %q is not an interface name", req.ContainerInterfaceName))
	}
	if req.ContainerInterfaceName != "" {
		// A DEL of an attachment whose ADD is still in flight (the
		// runtime gave up on the ADD) waits for it (attachLocks): answered
		// "not found" now, it would leave the endpoint the ADD then
		// creates behind. The plugin queues the deletion when the wait
		// outlasts its deadline.
		release, waited, err := s.attaching.lock(r.Context(), req.ContainerID, req.ContainerInterfaceName)
		if err != nil {
			return err
		}
		defer release()
		if waited {
			s.log.Info("delete waited for an attach of the same attachment in flight", "container", req.ContainerID,
				"interface", req.ContainerInterfaceName)
		}
	}
	eps := s.attachmentEndpoints(req.ContainerID, req.ContainerInterfaceName)
	if len(eps) == 0 {
		if req.ContainerInterfaceName != "" {
			return notFound(fmt.Sprintf("no endpoint for container %s interface %s", req.ContainerID, req.ContainerInterfaceName))
		}
		return notFound(fmt.Sprintf("no endpoint for container %s", req.ContainerID))
	}
	deleted := make([]int64, 0, len(eps))
	for _, ep := range eps {
		if _, err := endpointResult(s.sys.DeleteEndpoint(r.Context(), ep.ID, endpoint.DeleteOptions{})); err != nil {
			return err
		}
		s.syncHostPortsAfter(r.Context(), ep)
		deleted = append(deleted, int64(ep.ID))
	}
	writeJSON(w, http.StatusOK, &models.EndpointBatchDeleteResponse{Deleted: deleted})
	return nil
}

func (s *Server) patchLabels(w http.ResponseWriter, r *http.Request) error {
	ep, err := s.resolve(r)
	if err != nil {
		return err
	}
	var req models.LabelsPatch
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	add, err := apiLabels("add", req.Add)
	if err != nil {
		return err
	}
	del, err := apiLabels("delete", req.Delete)
	if err != nil {
		return err
	}
	if agentManaged(ep) {
		return badRequest(fmt.Sprintf("endpoint %d carries reserved labels: its labels are managed by the agent", ep.ID))
	}
	if len(ep.Labels)+len(add) > maxLabels {
		return badRequest(fmt.Sprintf("field \"add\": the endpoint would have more than %d labels", maxLabels))
	}
	got, err := endpointResult(s.sys.PatchLabels(r.Context(), ep.ID, add, del))
	if err != nil {
		return err
	}
	s.writeEndpoint(w, http.StatusOK, got)
	return nil
}

func (s *Server) regenerate(w http.ResponseWriter, r *http.Request) error {
	ep, err := s.resolve(r)
	if err != nil {
		return err
	}
	got, err := endpointResult(s.sys.Regenerate(r.Context(), ep.ID, "api"))
	if err != nil {
		return err
	}
	s.writeEndpoint(w, http.StatusOK, got)
	return nil
}

// endpointHealth checks the endpoint's datapath through the worker pool
// (the check may be a netlink call).
func (s *Server) endpointHealth(w http.ResponseWriter, r *http.Request) {
	ep, err := s.resolve(r)
	if err != nil {
		writeError(w, err)
		return
	}
	h := &models.EndpointHealth{ID: int64(ep.ID), State: string(ep.State), Datapath: "ok"}
	if err = s.sys.CheckEndpoint(r.Context(), ep); err != nil {
		h.Datapath, h.Message = "error", err.Error()
	}
	h.Healthy = err == nil && ep.State == endpoint.StateReady
	status := http.StatusOK
	if !h.Healthy {
		// A 503 body is the health and the API's error shape at once.
		status, h.Code = http.StatusServiceUnavailable, CodeUnhealthy
		if h.Message == "" {
			h.Message = fmt.Sprintf("endpoint %d is %s, not ready", ep.ID, ep.State)
		}
	}
	writeJSON(w, status, h)
}
