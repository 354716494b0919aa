package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/vishvananda/netns"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/datapath/podnet"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// attachRollbackTimeout bounds the undoing of a failed attach.
const attachRollbackTimeout = 15 * time.Second

// defaultMTU is the veth's MTU when the request gives none.
const defaultMTU = 1500

// attach is POST /v1/attach, a CNI ADD done in the agent: the plugin
// sends the attachment and prints the answer, one round trip instead of
// an address allocation and an endpoint PUT around its own netlink
// calls (and a short-lived process without the netlink work: measured in
// BENCHMARKS.md). Everything the request names is validated before any
// of it reaches a netlink call. The addresses are allocated while the
// veth is made; the endpoint is created (sync: its first regeneration
// done) while the pod's side is configured. Any failure undoes what this
// request made: the endpoint, the veth, every address.
//
// The handler runs on the request's goroutine (bounded by MaxInFlight),
// never in an actor: the netlink calls block only this request.
func (s *Server) attach(w http.ResponseWriter, r *http.Request) (retErr error) {
	begin := time.Now()
	var timing serverTiming
	if len(r.URL.Query()) != 0 {
		return badRequest("POST /v1/attach takes no query parameters")
	}
	var req models.AttachRequest
	if err := decodeBody(r, &req); err != nil {
		return err
	}
	spec, err := attachSpec(&req)
	if err != nil {
		return err
	}
	hostName, tmpName := podnet.VethNames(req.ContainerID, req.ContainerInterfaceName)
	// One attach of an attachment at a time (attachLocks): a retried ADD
	// waits for the one the plugin gave up on, then replaces it.
	release, waited, err := s.attaching.lock(r.Context(), req.ContainerID, req.ContainerInterfaceName)
	if err != nil {
		return err
	}
	defer release()
	if waited {
		s.log.Info("attach waited for an earlier attach of the same attachment", "container", req.ContainerID, "interface", req.ContainerInterfaceName)
	}
	if fn := s.labeler.Load(); fn != nil && spec.PodName != "" {
		start := time.Now()
		if spec.Labels, spec.NamedPorts, err = (*fn)(r.Context(), spec); err != nil {
			return fmt.Errorf("labels of pod %s/%s: %w", spec.Namespace, spec.PodName, err)
		}
		timing.add("labels", time.Since(start))
	}
	unlock, err := s.acceptHostPorts(&req, spec)
	if err != nil {
		return err
	}
	defer unlock()
	if req.Chained != nil {
		return s.attachChained(w, r, &req, spec, &timing, begin)
	}

	start := time.Now()
	phase := func(name string) { // one step of the attach, as a datapath phase
		now := time.Now()
		s.cfg.Metrics.DatapathPhase("attach-"+name, now.Sub(start))
		timing.add(name, now.Sub(start))
		start = now
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
	phase("netns")

	ctx := r.Context()
	alloc := make(chan struct{})
	var got actors.Allocation
	var allocErr error
	go func() {
		defer close(alloc)
		got, allocErr = s.sys.AllocateIP(ctx, "", req.Owner)
	}()
	defer func() {
		if retErr != nil {
			<-alloc
			s.releaseAll(got, req.Owner)
		}
	}()
	veth, err := pod.CreateVeth(hostName, req.ContainerInterfaceName, int(req.MTU))
	if errors.Is(err, podnet.ErrVethExists) {
		// A name is taken (the interface in the pod, or this attachment's
		// leftovers): the attachment's earlier endpoint goes, then its
		// host veth, the interface and the temporary name of older
		// plugins, as Cilium's ADD does.
		if err := s.deleteAttachment(ctx, req.ContainerID, req.ContainerInterfaceName); err != nil {
			return err
		}
		if err := pod.ClearLinks(hostName, req.ContainerInterfaceName, tmpName); err != nil {
			return podnetError(err)
		}
		veth, err = pod.CreateVeth(hostName, req.ContainerInterfaceName, int(req.MTU))
	}
	if errors.Is(err, podnet.ErrVethExists) {
		return &apiError{http.StatusConflict, CodeInterfaceExists,
			fmt.Sprintf("interface %q in netns %s or %s in the host stays taken", req.ContainerInterfaceName, req.Netns, hostName)}
	}
	if err != nil {
		return podnetError(err)
	}
	defer func() {
		if retErr != nil {
			veth.Rollback()
		}
	}()
	phase("veth")
	<-alloc
	phase("ipam-wait")
	if allocErr != nil {
		return fmt.Errorf("allocate address: %w", allocErr)
	}
	var addrs []podnet.Addr
	for _, a := range []struct {
		ip  netip.Addr
		fam ipam.Family
	}{{got.IPv4, ipam.IPv4}, {got.IPv6, ipam.IPv6}} {
		if a.ip.IsValid() {
			addrs = append(addrs, podnet.Addr{IP: a.ip, Gateway: s.ranges[a.fam].Gateway()})
		}
	}
	if len(addrs) == 0 {
		return &apiError{http.StatusInternalServerError, CodeInternal, "allocate address: the pool answered no address"}
	}
	spec.IPv4, spec.IPv6 = got.IPv4, got.IPv6
	spec.IfIndex = veth.HostIndex
	spec.MAC, spec.HostMAC = veth.PodMAC.String(), veth.HostMAC.String()
	if err := s.checkRanges(spec); err != nil {
		return err
	}

	// The endpoint is created while the pod's side is configured: the
	// datapath's work (state, host routes, programs) needs the host veth
	// and the addresses, not the pod's addresses and routes.
	mayExist := false
	defer func() {
		if retErr != nil && mayExist {
			s.deleteAttachmentQuietly(req.ContainerID, req.ContainerInterfaceName)
		}
	}()
	created := make(chan error, 1)
	var ep *endpoint.Endpoint
	go func() {
		var err error
		ep, err = endpointResult(s.sys.CreateEndpoint(ctx, spec, true))
		if errors.Is(err, actors.ErrEndpointExists) && len(s.attachmentEndpoints(req.ContainerID, req.ContainerInterfaceName)) > 0 {
			// An endpoint of this attachment without its veth (the name
			// was free): an earlier attach whose caller gave up created it
			// after its own rollback looked for it. No other attach of the
			// attachment is in flight (attachLocks): it is stale and
			// replaced, as the veth is.
			if derr := s.deleteAttachment(ctx, req.ContainerID, req.ContainerInterfaceName); derr == nil {
				ep, err = endpointResult(s.sys.CreateEndpoint(ctx, spec, true))
			}
		}
		// An error answer means no endpoint of this request: a failed
		// creation is removed by the agent, and a conflict is someone
		// else's. A cancelled wait may leave one.
		mayExist = err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
		created <- err
	}()
	mtu := routeMTU(int(req.MTU), s.cfg.TunnelMTU)
	cerr := pod.Configure(veth, addrs, mtu)
	phase("configure")
	perr := <-created // mayExist is set
	phase("endpoint-wait")
	if cerr != nil {
		return podnetError(cerr)
	}
	if perr != nil {
		return fmt.Errorf("create endpoint: %w", perr)
	}
	if err := s.hostPortsAfterCreate(ctx, spec); err != nil {
		return err
	}
	out := &models.AttachResponse{
		EndpointID:    int64(ep.ID),
		HostInterface: models.AttachInterface{Name: veth.HostName, Index: int64(veth.HostIndex), Mac: veth.HostMAC.String()},
		PodInterface:  models.AttachInterface{Name: veth.PodName, Index: int64(veth.PodIndex), Mac: veth.PodMAC.String()},
		RouteMTU:      int64(mtu),
	}
	for _, a := range addrs {
		aa := &models.AttachAddress{IP: a.IP.String(), Gateway: a.Gateway.String()}
		if a.IP.Is4() {
			out.IPv4 = aa
		} else {
			out.IPv6 = aa
		}
	}
	timing.add("total", time.Since(begin))
	w.Header().Set("Server-Timing", timing.String())
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// hostPortsAfterCreate writes the services of a new endpoint's hostPorts
// (none: nothing); failing, the caller undoes the attach (409 for a
// frontend another source owns).
func (s *Server) hostPortsAfterCreate(ctx context.Context, spec *endpoint.Endpoint) error {
	if len(spec.HostPorts) == 0 {
		return nil
	}
	err := s.SyncHostPorts(ctx)
	if errors.Is(err, service.ErrConflict) {
		return &apiError{http.StatusConflict, CodeConflict, err.Error()}
	}
	return err
}

// routeMTU is the MTU of the pod's routes: the veth's, or the tunnel
// device's when that is smaller (tunnelMTU 0: native routing). The veth
// keeps its own MTU, as Cilium's does (its route MTU is the device MTU
// minus the encapsulation): the pod's stack sizes packets by the route,
// and the node's own traffic over the veth is not capped.
func routeMTU(vethMTU, tunnelMTU int) int {
	if tunnelMTU > 0 && tunnelMTU < vethMTU {
		return tunnelMTU
	}
	return vethMTU
}

// serverTiming is a Server-Timing header value (W3C Server Timing): the
// attach's steps with their durations in milliseconds (labels: the pod's
// labels from the API server, when they are read; total: from the
// request's body to the answer), so that a caller can tell which step
// made a slow call slow (the plugin's phase record, make bench-cni's
// slowest calls). Names are fixed tokens.
type serverTiming []byte

func (t *serverTiming) add(name string, d time.Duration) {
	if len(*t) > 0 {
		*t = append(*t, ", "...)
	}
	*t = append(*t, name...)
	*t = append(*t, ";dur="...)
	*t = strconv.AppendFloat(*t, float64(d.Microseconds())/1000, 'f', 3, 64)
}

func (t serverTiming) String() string { return string(t) }

// attachSpec validates an attach request in full (its MTU defaulted)
// and returns the endpoint it asks for, still without the veth and the
// addresses; every refusal is a 400.
func attachSpec(req *models.AttachRequest) (*endpoint.Endpoint, error) {
	if req.ContainerID == "" || req.ContainerInterfaceName == "" || req.Netns == "" {
		return nil, badRequest("fields \"container-id\", \"container-interface-name\" and \"netns\": required")
	}
	if req.MTU == 0 {
		req.MTU = defaultMTU
	}
	if req.MTU < 68 || req.MTU > 65535 {
		return nil, badRequest(fmt.Sprintf("field \"mtu\": %d outside 68..65535", req.MTU))
	}
	if err := checkOwner(req.Owner); err != nil {
		return nil, err
	}
	ref := endpoint.Ref{Kind: endpoint.RefAttachment, ContainerID: req.ContainerID, IfName: req.ContainerInterfaceName}
	hostName, _ := podnet.VethNames(req.ContainerID, req.ContainerInterfaceName)
	return specFromRequest(ref, &models.EndpointChangeRequest{
		ContainerID: req.ContainerID, ContainerInterfaceName: req.ContainerInterfaceName,
		K8sNamespace: req.K8sNamespace, K8sPodName: req.K8sPodName, K8sUID: req.K8sUID,
		Labels: req.Labels, NamedPorts: req.NamedPorts, InterfaceName: hostName, Netns: req.Netns, SyncBuild: true,
	})
}

// podnetError gives a podnet failure its status and code.
func podnetError(err error) error {
	var pe *podnet.Error
	if errors.As(err, &pe) && pe.Kind == podnet.KindNetns {
		return &apiError{http.StatusBadRequest, CodeNetns, err.Error()}
	}
	return &apiError{http.StatusInternalServerError, CodeKernel, err.Error()}
}

// deleteAttachment deletes the endpoints of one CNI attachment; none, or
// one already being deleted, is fine.
func (s *Server) deleteAttachment(ctx context.Context, containerID, ifName string) error {
	for _, ep := range s.attachmentEndpoints(containerID, ifName) {
		_, err := s.sys.DeleteEndpoint(ctx, ep.ID, endpoint.DeleteOptions{})
		if err != nil && !errors.Is(err, actors.ErrEndpointNotFound) && !errors.Is(err, actors.ErrEndpointGone) &&
			!errors.Is(err, actors.ErrEndpointDeleting) {
			return fmt.Errorf("delete the attachment's earlier endpoint: %w", err)
		}
	}
	return nil
}

// deleteAttachmentQuietly is deleteAttachment during a rollback, on its
// own deadline (the request's may be what failed).
func (s *Server) deleteAttachmentQuietly(containerID, ifName string) {
	ctx, cancel := context.WithTimeout(context.Background(), attachRollbackTimeout)
	defer cancel()
	if err := s.deleteAttachment(ctx, containerID, ifName); err != nil {
		s.log.Warn("attach rollback: endpoint left", "container", containerID, "interface", ifName, "err", err)
	}
}

// releaseAll gives back the addresses of a failed attach (the agent
// never releases an address whose endpoint creation failed: the
// allocator owns it).
func (s *Server) releaseAll(got actors.Allocation, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), attachRollbackTimeout)
	defer cancel()
	for _, ip := range []netip.Addr{got.IPv4, got.IPv6} {
		if !ip.IsValid() {
			continue
		}
		if _, err := s.sys.ReleaseIP(ctx, ip, owner); err != nil {
			s.log.Warn("attach rollback: address left", "ip", ip, "err", err)
		}
	}
}
