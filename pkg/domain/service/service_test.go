package service

import (
	"errors"
	"net/netip"
	"testing"
)

// TestScopes: only NodePort and ExternalIP frontends have two scopes
// (the internal record flagged TwoScopes, the external one apart, never
// flagged); the scope is part of the frontend (key, order, string).
func TestScopes(t *testing.T) {
	fe := Frontend{Addr: netip.MustParseAddr("192.0.2.1"), Port: 30080, Proto: TCP}
	ext := fe
	ext.Scope = ScopeExternal
	bad := fe
	bad.Scope = 2
	for _, tc := range []struct {
		name string
		svc  Service
		ok   bool
	}{
		{"NodePort internal, two scopes", Service{Frontend: fe, Kind: KindNodePort, TwoScopes: true}, true},
		{"NodePort external", Service{Frontend: ext, Kind: KindNodePort}, true},
		{"ExternalIP external", Service{Frontend: ext, Kind: KindExternalIP}, true},
		{"ClusterIP two scopes", Service{Frontend: fe, Kind: KindClusterIP, TwoScopes: true}, false},
		{"ClusterIP external", Service{Frontend: ext, Kind: KindClusterIP}, false},
		{"HostPort external", Service{Frontend: ext, Kind: KindHostPort}, false},
		{"external record flagged two scopes", Service{Frontend: ext, Kind: KindNodePort, TwoScopes: true}, false},
		{"unknown scope", Service{Frontend: bad, Kind: KindNodePort}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.svc.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Errorf("Validate = %v, want ok %v", err, tc.ok)
			}
		})
	}
	if fe.String() != "192.0.2.1:30080/TCP" || ext.String() != "192.0.2.1:30080/TCP/external" {
		t.Errorf("strings %q, %q", fe, ext)
	}
	if fe == ext || fe.Compare(ext) >= 0 || ext.Compare(fe) <= 0 {
		t.Errorf("the scopes of one address are one frontend, or misordered")
	}
	a, b := Service{Frontend: fe, Kind: KindNodePort}, Service{Frontend: fe, Kind: KindNodePort, TwoScopes: true}
	if a.Equal(&b) {
		t.Error("Equal ignores TwoScopes")
	}
}
