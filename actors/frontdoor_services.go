package actors

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// The front door's service table methods. Each validates its input,
// sends one message to the services actor and returns once the datapath
// write holding the change finished (the row's state says how it went).

// sourcePattern is a source's name: "k8s", "api", "bench-1".
var sourcePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ServiceResult is what an upsert, delete or replace changed.
type ServiceResult struct {
	Upserted, Deleted int
}

func checkServices(source string, svcs []service.Service) error {
	if !sourcePattern.MatchString(source) {
		return fmt.Errorf("service source %q: %w", source, service.ErrInvalid)
	}
	seen := make(map[service.Frontend]bool, len(svcs))
	for i := range svcs {
		if err := svcs[i].Validate(); err != nil {
			return err
		}
		if seen[svcs[i].Frontend] {
			return fmt.Errorf("service %s given twice: %w", svcs[i].Frontend, service.ErrInvalid)
		}
		seen[svcs[i].Frontend] = true
	}
	return nil
}

// UpsertService adds or replaces source's service s. Returns an error
// wrapping service.ErrInvalid for a bad field and service.ErrConflict
// for a frontend another source owns.
func (s *System) UpsertService(ctx context.Context, source string, svc service.Service) (ServiceResult, error) {
	return s.upsertServices(ctx, source, []service.Service{svc}, false)
}

// ReplaceServices makes source's services exactly svcs (the full set
// from that source: a mark and sweep).
func (s *System) ReplaceServices(ctx context.Context, source string, svcs []service.Service) (ServiceResult, error) {
	return s.upsertServices(ctx, source, svcs, true)
}

// UpsertServices adds or replaces several of source's services at once.
func (s *System) UpsertServices(ctx context.Context, source string, svcs []service.Service) (ServiceResult, error) {
	return s.upsertServices(ctx, source, svcs, false)
}

func (s *System) upsertServices(ctx context.Context, source string, svcs []service.Service, replace bool) (ServiceResult, error) {
	if err := checkServices(source, svcs); err != nil {
		return ServiceResult{}, err
	}
	cp := make([]service.Service, len(svcs))
	for i, v := range svcs {
		v.Backends = append([]service.Backend(nil), v.Backends...)
		cp[i] = v
	}
	return serviceAnswer(s.ask(ctx, s.services, &messages.ServiceUpsert{Source: source, Services: cp, Replace: replace}))
}

// DeleteService deletes source's frontends; frontends it does not hold
// (or another source holds) are skipped.
func (s *System) DeleteService(ctx context.Context, source string, frontends ...service.Frontend) (ServiceResult, error) {
	if !sourcePattern.MatchString(source) {
		return ServiceResult{}, fmt.Errorf("service source %q: %w", source, service.ErrInvalid)
	}
	for _, f := range frontends {
		if err := f.Validate(); err != nil {
			return ServiceResult{}, err
		}
	}
	fs := append([]service.Frontend(nil), frontends...)
	return serviceAnswer(s.ask(ctx, s.services, &messages.ServiceDelete{Source: source, Frontends: fs}))
}

// PruneServices makes the datapath's service maps hold exactly the
// table (sent once the feeders delivered their first full sets).
func (s *System) PruneServices() { s.Actors.Root.Send(s.services, &messages.ServicePrune{}) }

// DumpServiceMaps reads the datapath's service maps back in the pool.
func (s *System) DumpServiceMaps(ctx context.Context) (datapath.LBMaps, error) {
	d, ok := s.Datapath.(datapath.ServiceDatapath)
	if !ok {
		return datapath.LBMaps{}, fmt.Errorf("service maps of the %s datapath: %w", s.Datapath.Name(), ErrNotSupported)
	}
	v, err := s.RunBlocking(ctx, "dump-services", 0, func(c context.Context) (any, error) { return d.DumpServices(c) })
	m, _ := v.(datapath.LBMaps)
	return m, err
}

func serviceAnswer(res any, err error) (ServiceResult, error) {
	r, err := answer[*messages.ServiceResult](res, err)
	if err != nil {
		return ServiceResult{}, err
	}
	return ServiceResult{Upserted: r.Upserted, Deleted: r.Deleted}, r.Err
}

// SetPolicyService tells the policy repository Service namespace/name
// (svc nil: deleted) for the toServices rules: the endpoints whose policy
// changes regenerate. It does not wait.
func (s *System) SetPolicyService(namespace, name string, svc *policy.Service) {
	s.Actors.Root.Send(s.deps.policy, &messages.PolicyServiceSet{Namespace: namespace, Name: name, Service: svc})
}

// SetKubeAPIServerAddrs gives the ipcache the API server's addresses (its
// own EndpointSlice, default/kubernetes): identity kube-apiserver where
// the address is not this node's. It does not wait.
func (s *System) SetKubeAPIServerAddrs(addrs []netip.Addr) {
	s.Actors.Root.Send(s.deps.ipcache, &messages.IPCacheReservedSet{Source: index.SourceKubeAPIServer, Addrs: slices.Clone(addrs)})
}
