package datapath

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	"github.com/membrane-cni/membrane/bpf"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestRealizeHostPolicy: the host endpoint's entry (key 0) names a slot
// holding its policy and carries its audit mode; after a restart the pinned maps are read back and
// written by difference; no host policy removes the entry (everything
// passes).
func TestRealizeHostPolicy(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	// Enabled after Init: the test's netns has no uplink to attach to.
	l.cfg.HostFirewall.Enabled = true
	ssh := policy.Key{Identity: identity.ReservedWorld, Port: 22, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	web := policy.Key{Identity: identity.ReservedWorld, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}
	check := func(audit bool, want ...policy.Key) {
		t.Helper()
		var v bpf.EndpointEndpointInfo
		if err := l.bpf.maps.endpoints.Lookup(uint32(hostEndpointKey), &v); err != nil {
			t.Fatalf("host endpoint entry: %v", err)
		}
		if got := v.Flags&endpointFlagAudit != 0; got != audit {
			t.Fatalf("host endpoint entry %+v: audit %v, want %v", v, got, audit)
		}
		if v.Id != HostEndpointID || v.Identity != uint32(identity.ReservedHost) || !slotHolds(l.bpf.maps.policyMaps, v.Slot, l.bpf.host.policyMap) {
			t.Fatalf("host endpoint entry %+v does not name its maps", v)
		}
		entries, in, _, err := dumpPolicyMap(l.bpf.host.policyMap)
		if err != nil {
			t.Fatal(err)
		}
		if !in || len(entries) != len(want) {
			t.Fatalf("host policy map: ingress %v, entries %+v, want %v", in, entries, want)
		}
		for i, k := range want {
			if entries[i].Key != k {
				t.Fatalf("host policy map entries %+v, want %v", entries, want)
			}
		}
	}
	if err := l.RealizeHostPolicy(ctx, policy.NewMapState(1, true, false, []policy.Key{ssh}), false); err != nil {
		t.Fatal(err)
	}
	check(false, ssh)
	l.cfg.HostFirewall.Enabled = false
	l = reopen(t, l) // the host firewall off at Init removes the entry; the pinned maps stay
	l.cfg.HostFirewall.Enabled = true
	if err := l.RealizeHostPolicy(ctx, policy.NewMapState(2, true, false, []policy.Key{ssh, web}), true); err != nil {
		t.Fatal(err)
	}
	check(true, ssh, web)
	if err := l.RealizeHostPolicy(ctx, nil, false); err != nil {
		t.Fatal(err)
	}
	var v bpf.EndpointEndpointInfo
	if err := l.bpf.maps.endpoints.Lookup(uint32(hostEndpointKey), &v); err == nil {
		t.Fatalf("host endpoint entry %+v left without a host policy", v)
	}
	l.cfg.HostFirewall.Enabled = false
}

// TestSetHostSafePeers: the safety net (host_safe) holds the configured
// peers and the latest SetHostSafePeers' (the API server's
// EndpointSlice): a change replaces the previous ones, the configured
// stay; none leaves the configured only.
func TestSetHostSafePeers(t *testing.T) {
	l, _, _ := newTestLinux(t, LinuxConfig{TeardownDelay: -1})
	ctx := context.Background()
	// Enabled after Init: the test's netns has no uplink to attach to.
	l.cfg.HostFirewall.Enabled = true
	dialled := netip.MustParseAddrPort("192.0.2.1:6443")
	l.cfg.HostFirewall.SafePeers = []netip.AddrPort{dialled}
	check := func(want ...netip.AddrPort) {
		t.Helper()
		var got []bpf.EndpointHostSafeKey
		var k bpf.EndpointHostSafeKey
		var v uint32
		it := l.bpf.maps.hostSafe.Iterate()
		for it.Next(&k, &v) {
			got = append(got, k)
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("host_safe holds %+v, want %v", got, want)
		}
		for _, ap := range want {
			if !slices.Contains(got, safeKey(ap)) {
				t.Fatalf("host_safe holds %+v, want %v (no %v)", got, want, ap)
			}
		}
	}
	a := netip.MustParseAddrPort("192.0.2.10:6443")
	b := netip.MustParseAddrPort("[2001:db8::10]:6443")
	c := netip.MustParseAddrPort("192.0.2.11:443")
	if err := l.SetHostSafePeers(ctx, []netip.AddrPort{a, b}); err != nil {
		t.Fatal(err)
	}
	check(dialled, a, b)
	if err := l.SetHostSafePeers(ctx, []netip.AddrPort{c}); err != nil {
		t.Fatal(err)
	}
	check(dialled, c)
	if err := l.SetHostSafePeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	check(dialled)
}
