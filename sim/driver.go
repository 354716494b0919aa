package sim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// PodRef names a pod to a Driver, as kubelet and the CNI plugin know it.
type PodRef struct {
	Namespace, Name, ContainerID string
	// Labels are the pod's labels at ADD ("k8s:app=sim").
	Labels []string
	// IPv4 is the pod's address, which DEL releases when the endpoint is
	// already gone. Leave it unset when an earlier DEL may have released
	// it: the agent may have given it to another pod since.
	IPv4 netip.Addr
}

// Owner is the IPAM owner of the pod's addresses, "namespace/name".
func (p PodRef) Owner() string { return p.Namespace + "/" + p.Name }

// AddResult is what an ADD established, even when it failed.
type AddResult struct {
	// IPv4 is the acknowledged address (valid once the allocation answered).
	IPv4 netip.Addr
	// Endpoint is the acknowledged endpoint ID; 0 if the create failed.
	Endpoint int64
	// IPAMUnknown: the allocation failed ambiguously, an address may be
	// allocated to the pod's owner. CreateUnknown: the create failed
	// ambiguously, the endpoint may appear later.
	IPAMUnknown, CreateUnknown bool
}

// DelResult says what a DEL found.
type DelResult struct {
	// Found: the endpoint existed and was deleted (with its address).
	Found bool
}

// Driver performs pod operations against the agent the way kubelet and
// the CNI plugin do. The API driver (--datapath fake) calls the REST API:
// ADD is POST /v1/ipam then a sync PUT, DEL is DELETE /v1/endpoint then,
// if there was none, DELETE /v1/ipam/{ip}. A CNI-driven driver (for
// --datapath linux) would run membrane-cni ADD and DEL in a network
// namespace per pod and use the API for the rest.
type Driver interface {
	// Add allocates the pod's address and creates its endpoint; the
	// result says what happened even when it fails.
	Add(ctx context.Context, p PodRef) (AddResult, error)
	// Del deletes the pod's endpoint, which releases its address; if there
	// is none, it releases p.IPv4 (if set). Deleting a pod that is already
	// gone is success.
	Del(ctx context.Context, p PodRef) (DelResult, error)
	// Regenerate asks for a regeneration and waits for it.
	Regenerate(ctx context.Context, p PodRef) error
	// Relabel adds and deletes labels.
	Relabel(ctx context.Context, p PodRef, add, del []string) error
	// Endpoints lists the endpoints of a namespace.
	Endpoints(ctx context.Context, namespace string) ([]*models.Endpoint, error)
	// Allocations lists the allocated addresses and their owners.
	Allocations(ctx context.Context) ([]models.IPAMAllocation, error)
	// Release releases one address.
	Release(ctx context.Context, ip netip.Addr) error
}

var (
	// errBadAnswer is returned when the agent answers something unusable.
	errBadAnswer = errors.New("unexpected answer from the agent")
	// errReset is wrapped by the errors of calls in flight when the agent
	// crashed: the harness resets them, as a killed agent's connections are.
	errReset = errors.New("connection reset: agent crashed")
)

// apiDriver is the Driver over the REST API. Every call holds gate for
// reading, so that the crash controller can wait for calls in flight and
// hold new ones while it verifies a restarted agent, and runs under the
// current epoch, which a crash cancels.
type apiDriver struct {
	c     *client.Client
	rec   *recorder
	gate  *sync.RWMutex
	epoch *atomic.Pointer[epoch]
}

var _ Driver = (*apiDriver)(nil)

func (d *apiDriver) call(ctx context.Context, o op, fn func(context.Context) error) error {
	d.gate.RLock()
	defer d.gate.RUnlock()
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(d.epoch.Load().ctx, func() { cancel(errReset) })
	defer stop()
	start := time.Now()
	err := fn(cctx)
	if err != nil && errors.Is(context.Cause(cctx), errReset) {
		err = fmt.Errorf("%w: %w", errReset, err)
	}
	d.rec.observe(o, time.Since(start), err)
	return err
}

func (d *apiDriver) Add(ctx context.Context, p PodRef) (AddResult, error) {
	var res AddResult
	var ipr *models.IPAMResponse
	err := d.call(ctx, opIPAMAllocate, func(ctx context.Context) (err error) {
		ipr, err = d.c.IPAMAllocate(ctx, "ipv4", p.Owner())
		return err
	})
	if err != nil {
		res.IPAMUnknown = ambiguous(err)
		return res, fmt.Errorf("add %s: allocate: %w", p.ContainerID, err)
	}
	if ipr.Address == nil {
		return res, fmt.Errorf("add %s: allocate: no address: %w", p.ContainerID, errBadAnswer)
	}
	if res.IPv4, err = netip.ParseAddr(ipr.Address.IPv4); err != nil {
		return res, fmt.Errorf("add %s: allocate: %w", p.ContainerID, err)
	}
	req := &models.EndpointChangeRequest{ContainerID: p.ContainerID, ContainerInterfaceName: "eth0",
		K8sNamespace: p.Namespace, K8sPodName: p.Name, Labels: p.Labels,
		Addressing: &models.AddressPair{IPv4: res.IPv4.String()}, SyncBuild: true}
	var ep *models.Endpoint
	err = d.call(ctx, opPut, func(ctx context.Context) (err error) {
		ep, err = d.c.EndpointCreate(ctx, "0", req)
		return err
	})
	if err != nil {
		res.CreateUnknown = ambiguous(err)
		return res, fmt.Errorf("add %s: create endpoint: %w", p.ContainerID, err)
	}
	res.Endpoint = ep.ID
	return res, nil
}

func (d *apiDriver) Del(ctx context.Context, p PodRef) (DelResult, error) {
	err := d.call(ctx, opDelete, func(ctx context.Context) error {
		return d.c.EndpointDelete(ctx, "container-id:"+p.ContainerID)
	})
	switch {
	case err == nil:
		return DelResult{Found: true}, nil // the delete released the address
	case !isNotFound(err):
		return DelResult{}, fmt.Errorf("del %s: %w", p.ContainerID, err)
	case !p.IPv4.IsValid():
		return DelResult{}, nil
	}
	// Released only if still the pod's: an agent restart forgets
	// addresses no endpoint claimed and may have given this one to
	// another pod since (409 address-in-use: not ours to release).
	err = d.call(ctx, opIPAMRelease, func(ctx context.Context) error {
		return d.c.IPAMReleaseOwned(ctx, p.IPv4.String(), p.Owner())
	})
	if err != nil && !isCode(err, api.CodeAddressInUse) {
		return DelResult{}, fmt.Errorf("del %s: %w", p.ContainerID, err)
	}
	return DelResult{}, nil
}

func (d *apiDriver) Regenerate(ctx context.Context, p PodRef) error {
	return d.call(ctx, opRegenerate, func(ctx context.Context) error {
		_, err := d.c.EndpointRegenerate(ctx, "container-id:"+p.ContainerID)
		return err
	})
}

func (d *apiDriver) Relabel(ctx context.Context, p PodRef, add, del []string) error {
	return d.call(ctx, opRelabel, func(ctx context.Context) error {
		_, err := d.c.EndpointPatchLabels(ctx, "container-id:"+p.ContainerID, add, del)
		return err
	})
}

func (d *apiDriver) Endpoints(ctx context.Context, namespace string) ([]*models.Endpoint, error) {
	var eps []*models.Endpoint
	err := d.call(ctx, opList, func(ctx context.Context) (err error) {
		eps, err = d.c.EndpointList(ctx, url.Values{"namespace": {namespace}})
		return err
	})
	return eps, err
}

func (d *apiDriver) Allocations(ctx context.Context) ([]models.IPAMAllocation, error) {
	var st *models.IPAMStatus
	err := d.call(ctx, opList, func(ctx context.Context) (err error) {
		st, err = d.c.IPAMStatus(ctx)
		return err
	})
	if err != nil {
		return nil, err
	}
	var out []models.IPAMAllocation
	for _, fam := range []*models.IPAMFamilyStatus{st.IPv4, st.IPv6} {
		if fam != nil {
			out = append(out, fam.Allocations...)
		}
	}
	return out, nil
}

func (d *apiDriver) Release(ctx context.Context, ip netip.Addr) error {
	return d.call(ctx, opIPAMRelease, func(ctx context.Context) error {
		return d.c.IPAMRelease(ctx, ip.String())
	})
}
