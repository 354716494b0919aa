package datapath

import (
	"context"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// LBService is one service frontend as the datapath holds it: its
// backends fill slots 1..len(Backends) of service number ID.
type LBService struct {
	ID       uint32
	Frontend service.Frontend
	Backends []service.Backend
	// Affinity is the ClientIP affinity timeout (0: none).
	Affinity time.Duration
	// External frontends (NodePort, external addresses) are translated
	// on the node's uplinks too in the kube-proxy-free mode.
	External bool
	// TwoScopes: the uplinks translate this internal-scope frontend by
	// its external-scope record (service.ScopeExternal) instead.
	TwoScopes bool
}

// LBFrontendEntry is one entry of the frontend map as read back.
type LBFrontendEntry struct {
	Frontend service.Frontend
	ID       uint32
	Count    uint32
	// Affinity is the ClientIP affinity timeout in seconds (0: none).
	Affinity uint32
	// External: translated on the uplinks too.
	External bool
	// TwoScopes: the uplinks use the external-scope record instead.
	TwoScopes bool
}

// LBBackendEntry is one entry of the backend slot map as read back.
type LBBackendEntry struct {
	ID      uint32
	Slot    uint32
	Backend service.Backend
}

// LBMaps is what the service maps hold.
type LBMaps struct {
	Frontends []LBFrontendEntry
	Backends  []LBBackendEntry
	// Connections counts the translated connections (lb_ct entries),
	// ReverseNAT the replies' translations (lb_revnat entries),
	// Affinity the ClientIP affinity entries; stale ones included.
	Connections, ReverseNAT, Affinity int
	// NodePortNAT counts the NodePort connections from outside (lb_nat),
	// NodePortSNAT their SNATed replies' entries (lb_nat_rev), Sockets
	// the socket-level translations (lb_sock); stale ones included.
	NodePortNAT, NodePortSNAT, Sockets int
	// Hooks is what the kube-proxy-free mode has attached.
	Hooks ServiceHooks
}

// ServiceHooks is what the kube-proxy-free mode attached: the socket
// programs on a cgroup and from_netdev on the uplinks (none of it with
// kube-proxy).
type ServiceHooks struct {
	KubeProxyReplacement bool
	// Cgroup is the cgroup2 directory holding the socket programs,
	// SocketPrograms their attach points ("connect4", ...).
	Cgroup         string
	SocketPrograms []string
	// Devices are the uplinks running from_netdev.
	Devices []string
}

// ServiceDatapath is implemented by datapaths that translate services
// (the Linux datapath's lb maps, the Fake). Writes are idempotent.
type ServiceDatapath interface {
	// UpsertService makes the maps hold s; prevBackends is the backend
	// count it held before (0 if new); slots beyond len(s.Backends) go.
	// Backends are written before the frontend's count, so a new
	// connection never picks a slot that does not hold a backend of s.
	UpsertService(ctx context.Context, s LBService, prevBackends int) error
	// DeleteService removes frontend f (service number id, holding
	// prevBackends slots); a missing entry is success.
	DeleteService(ctx context.Context, f service.Frontend, id uint32, prevBackends int) error
	// SyncServices makes the maps hold exactly desired, deleting what a
	// previous agent left (called once the first full set is known).
	SyncServices(ctx context.Context, desired []LBService) error
	// DumpServices reads the maps back.
	DumpServices(ctx context.Context) (LBMaps, error)
}
