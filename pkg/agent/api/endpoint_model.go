package api

import (
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// endpointModel converts a record to its API form. ident may be nil.
func endpointModel(e *endpoint.Endpoint, ident *models.Identity) *models.Endpoint {
	m := &models.Endpoint{
		ID:                     int64(e.ID),
		State:                  string(e.State),
		ContainerID:            e.ContainerID,
		ContainerName:          e.ContainerName,
		ContainerInterfaceName: e.ContainerInterfaceName,
		K8sNamespace:           e.Namespace,
		K8sPodName:             e.PodName,
		K8sUID:                 e.PodUID,
		Labels:                 e.Labels.Strings(),
		Identity:               ident,
		InterfaceName:          e.IfName,
		InterfaceIndex:         int64(e.IfIndex),
		Mac:                    e.MAC,
		HostMac:                e.HostMAC,
		Netns:                  e.Netns,
		Chained:                e.Chained,
		PolicyAuditMode:        e.PolicyAudit,
		PolicyRevision:         e.RealizedRevision,
		Regenerations:          e.Regenerations,
		LastError:              e.LastError,
		Created:                e.Created,
		StateChanged:           e.StateChanged,
	}
	if m.Labels == nil {
		m.Labels = []string{}
	}
	if e.IPv4.IsValid() || e.IPv6.IsValid() {
		m.Addressing = &models.AddressPair{}
		if e.IPv4.IsValid() {
			m.Addressing.IPv4 = e.IPv4.String()
		}
		if e.IPv6.IsValid() {
			m.Addressing.IPv6 = e.IPv6.String()
		}
	}
	if ident == nil && e.Identity != identity.IdentityUnknown {
		m.Identity = &models.Identity{ID: int64(e.Identity)}
	}
	return m
}
