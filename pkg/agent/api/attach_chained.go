package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"

	"github.com/membrane-cni/membrane/datapath/podnet"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ifname"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

// attachChained is POST /v1/attach with "chained": CNI chaining after a
// plugin that made the veth and gave the addresses (Cilium's generic
// veth chaining). Nothing is allocated or created: the request's host
// interface must be the host end of the pair whose pod end is the
// container interface, holding every address given; the endpoint is
// created with those addresses on that interface (Endpoint.Chained), so
// the datapath attaches its programs there and leaves the link, routes
// and sysctls to the other plugin. An earlier endpoint of the same
// attachment (a runtime's retried ADD) is deleted first. A failed
// creation leaves nothing: the agent removes an endpoint whose creation
// failed, and nothing else was made.
func (s *Server) attachChained(w http.ResponseWriter, r *http.Request, req *models.AttachRequest, spec *endpoint.Endpoint, timing *serverTiming, begin time.Time) error {
	ch := req.Chained
	addrs, err := s.chainedAddrs(req)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if err := s.deleteAttachment(ctx, req.ContainerID, req.ContainerInterfaceName); err != nil {
		return err
	}
	for _, ip := range addrs {
		if other, ok := s.ix.EndpointByIP(ip); ok {
			return &apiError{http.StatusConflict, CodeConflict, fmt.Sprintf("field \"chained\": address %s is endpoint %d's", ip, other.ID)}
		}
	}
	host := netns.None()
	if s.cfg.HostNetns != "" {
		if host, err = netns.GetFromPath(s.cfg.HostNetns); err != nil {
			return podnetError(&podnet.Error{Kind: podnet.KindKernel, Op: "open host netns " + s.cfg.HostNetns, Err: err})
		}
		defer host.Close()
	}
	pod, err := podnet.Open(req.Netns, host)
	if err != nil {
		return podnetError(err)
	}
	defer pod.Close()
	veth, err := pod.FindVeth(req.ContainerInterfaceName, int(ch.HostIndex), ch.HostInterface, addrs)
	if errors.Is(err, podnet.ErrNotChainable) {
		return badRequest("field \"chained\": " + err.Error())
	}
	if err != nil {
		return podnetError(err)
	}
	timing.add("veth", time.Since(begin))
	spec.Chained = true
	spec.IfName, spec.IfIndex = veth.HostName, veth.HostIndex
	spec.MAC, spec.HostMAC = veth.PodMAC.String(), veth.HostMAC.String()
	for _, ip := range addrs {
		if ip.Is4() {
			spec.IPv4 = ip
		} else {
			spec.IPv6 = ip
		}
	}
	ep, err := endpointResult(s.sys.CreateEndpoint(ctx, spec, true))
	if err != nil {
		return fmt.Errorf("create endpoint: %w", err)
	}
	if err := s.hostPortsAfterCreate(ctx, spec); err != nil {
		s.deleteAttachmentQuietly(req.ContainerID, req.ContainerInterfaceName)
		s.syncHostPortsAfter(context.Background(), spec)
		return err
	}
	out := &models.AttachResponse{
		EndpointID:    int64(ep.ID),
		HostInterface: models.AttachInterface{Name: veth.HostName, Index: int64(veth.HostIndex), Mac: veth.HostMAC.String()},
		PodInterface:  models.AttachInterface{Name: veth.PodName, Index: int64(veth.PodIndex), Mac: veth.PodMAC.String()},
	}
	if spec.IPv4.IsValid() {
		out.IPv4 = &models.AttachAddress{IP: spec.IPv4.String()}
	}
	if spec.IPv6.IsValid() {
		out.IPv6 = &models.AttachAddress{IP: spec.IPv6.String()}
	}
	timing.add("total", time.Since(begin))
	w.Header().Set("Server-Timing", timing.String())
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// chainedAddrs validates a chained attach's host interface and
// addresses: a kernel interface name and index when given (else the pod
// end's peer is the host end), at least one address, at
// most one per family, each a unicast address outside the agent's own
// pools (Membrane allocates there; a chained plugin's IPAM must not).
func (s *Server) chainedAddrs(req *models.AttachRequest) ([]netip.Addr, error) {
	ch := req.Chained
	if ch.HostInterface != "" && !ifname.Valid(ch.HostInterface) {
		return nil, badRequest(fmt.Sprintf("field \"chained.host-interface\": %q is not an interface name", ch.HostInterface))
	}
	if ch.HostIndex < 0 || ch.HostIndex > 1<<31-1 {
		return nil, badRequest(fmt.Sprintf("field \"chained.host-index\": %d out of range", ch.HostIndex))
	}
	var addrs []netip.Addr
	for _, f := range []struct {
		field, text string
		fam         ipam.Family
	}{{"chained.ipv4", ch.IPv4, ipam.IPv4}, {"chained.ipv6", ch.IPv6, ipam.IPv6}} {
		if f.text == "" {
			continue
		}
		ip, err := netip.ParseAddr(f.text)
		if err != nil || ip.Zone() != "" || (f.fam == ipam.IPv4) != ip.Is4() || ip.Is4In6() {
			return nil, &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("field %q: %q is not an %s address", f.field, f.text, f.fam)}
		}
		if !ip.IsGlobalUnicast() {
			return nil, &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("field %q: %s is not a unicast address a pod may hold", f.field, ip)}
		}
		if rg := s.ranges[f.fam]; rg != nil && rg.Prefix().Contains(ip) {
			return nil, &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("field %q: %s is in the agent's pool %s: a chained plugin's IPAM must use another range", f.field, ip, rg.Prefix())}
		}
		addrs = append(addrs, ip)
	}
	if len(addrs) == 0 {
		return nil, &apiError{http.StatusBadRequest, CodeInvalidAddress, "field \"chained\": at least one of ipv4 and ipv6 is required"}
	}
	return addrs, nil
}
