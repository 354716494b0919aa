package api

import (
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

func TestModel(t *testing.T) {
	ls, err := labels.ParseSet([]string{"k8s:app=web", "k8s:tier=fe"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		ep    endpoint.Endpoint
		ident *models.Identity
		check func(t *testing.T, m *models.Endpoint)
	}{
		{
			name: "empty",
			ep:   endpoint.Endpoint{ID: 1, State: endpoint.StateWaitingForIdentity},
			check: func(t *testing.T, m *models.Endpoint) {
				if m.Labels == nil || len(m.Labels) != 0 {
					t.Errorf("Labels = %#v, want empty non-nil", m.Labels)
				}
				if m.Addressing != nil {
					t.Errorf("Addressing = %+v, want nil", m.Addressing)
				}
				if m.Identity != nil {
					t.Errorf("Identity = %+v, want nil", m.Identity)
				}
			},
		},
		{
			name: "full",
			ep: endpoint.Endpoint{ID: 2, State: endpoint.StateReady, Labels: ls, IPv4: netip.MustParseAddr("10.0.0.2"),
				IPv6: netip.MustParseAddr("fd00::2"), Identity: 300, RealizedRevision: 4, Namespace: "ns", PodName: "p"},
			check: func(t *testing.T, m *models.Endpoint) {
				if m.ID != 2 || m.State != "ready" || m.PolicyRevision != 4 || m.K8sNamespace != "ns" || m.K8sPodName != "p" {
					t.Errorf("model = %+v", m)
				}
				if m.Addressing == nil || m.Addressing.IPv4 != "10.0.0.2" || m.Addressing.IPv6 != "fd00::2" {
					t.Errorf("Addressing = %+v", m.Addressing)
				}
				if m.Identity == nil || m.Identity.ID != 300 {
					t.Errorf("Identity = %+v, want id 300", m.Identity)
				}
				if len(m.Labels) != 2 || m.Labels[0] != "k8s:app=web" {
					t.Errorf("Labels = %v", m.Labels)
				}
			},
		},
		{
			name:  "given identity",
			ep:    endpoint.Endpoint{ID: 3, Identity: identity.NumericIdentity(300), IPv6: netip.MustParseAddr("fd00::3")},
			ident: &models.Identity{ID: 300, Labels: []string{"k8s:app=web"}, RefCount: 2},
			check: func(t *testing.T, m *models.Endpoint) {
				if m.Identity == nil || m.Identity.RefCount != 2 {
					t.Errorf("Identity = %+v, want the given one", m.Identity)
				}
				if m.Addressing == nil || m.Addressing.IPv4 != "" || m.Addressing.IPv6 != "fd00::3" {
					t.Errorf("Addressing = %+v", m.Addressing)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, endpointModel(&tt.ep, tt.ident))
		})
	}
}
