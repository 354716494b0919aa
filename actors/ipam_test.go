package actors_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

func TestIPAMAllocate(t *testing.T) {
	h := startSystem(t, nil)
	tests := []struct {
		name           string
		family         ipam.Family
		wantV4, wantV6 bool
	}{
		{"both families", "", true, true},
		{"ipv4", ipam.IPv4, true, false},
		{"ipv6", ipam.IPv6, false, true},
	}
	seen := map[netip.Addr]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			owner := "ns/" + tt.name
			r := h.allocate(t, tt.family, owner)
			if r.Err != nil {
				t.Fatalf("allocate: %v", r.Err)
			}
			if r.IPv4.IsValid() != tt.wantV4 || r.IPv6.IsValid() != tt.wantV6 {
				t.Fatalf("allocate %q = %v / %v", tt.family, r.IPv4, r.IPv6)
			}
			for _, ip := range []netip.Addr{r.IPv4, r.IPv6} {
				if !ip.IsValid() {
					continue
				}
				if seen[ip] {
					t.Errorf("%s handed out twice", ip)
				}
				seen[ip] = true
				if ip.Is4() && !testIPv4.Contains(ip) || ip.Is6() && !testIPv6.Contains(ip) {
					t.Errorf("%s outside the configured ranges", ip)
				}
				// The reply is sent after the index commit.
				row, ok := h.ix.IP(ip)
				if !ok {
					t.Fatalf("index has no row for %s right after the reply", ip)
				}
				wantFam := "ipv4"
				if ip.Is6() {
					wantFam = "ipv6"
				}
				if row.Owner != owner || row.Family != wantFam || row.Endpoint != 0 || row.Holder != "" {
					t.Errorf("row %+v, want owner %q family %s, unclaimed", row, owner, wantFam)
				}
			}
		})
	}
	if n := len(h.ix.IPs("")); n != 4 {
		t.Errorf("index holds %d addresses, want 4", n)
	}
}

func TestIPAMAllocateIP(t *testing.T) {
	h := startSystem(t, nil)
	tests := []struct {
		name    string
		ip      string
		owner   string
		wantErr error
	}{
		{"ipv4", "10.200.0.50", "ns/a", nil},
		{"again same owner is idempotent", "10.200.0.50", "ns/a", nil},
		{"again other owner", "10.200.0.50", "ns/b", ipam.ErrAllocated},
		{"ipv6", "fd00:200::50", "ns/a", nil},
		{"gateway reserved", "10.200.0.1", "ns/a", ipam.ErrReserved},
		{"network reserved", "10.200.0.0", "ns/a", ipam.ErrReserved},
		{"broadcast reserved", "10.200.0.255", "ns/a", ipam.ErrReserved},
		{"out of range", "10.201.0.5", "ns/a", ipam.ErrOutOfRange},
		{"out of range ipv6", "fd00:201::5", "ns/a", ipam.ErrOutOfRange},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip := netip.MustParseAddr(tt.ip)
			r := askAs[*messages.IPAMAllocated](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMAllocateIP{IP: ip, Owner: tt.owner})
			if tt.wantErr != nil {
				if !errors.Is(r.Err, tt.wantErr) {
					t.Fatalf("allocate %s: %v, want %v", ip, r.Err, tt.wantErr)
				}
				return
			}
			if r.Err != nil {
				t.Fatalf("allocate %s: %v", ip, r.Err)
			}
			got := r.IPv4
			if ip.Is6() {
				got = r.IPv6
			}
			if got != ip {
				t.Fatalf("allocate %s answered %v / %v", ip, r.IPv4, r.IPv6)
			}
			if row, ok := h.ix.IP(ip); !ok || row.Owner != tt.owner {
				t.Fatalf("index row %+v, %v", row, ok)
			}
		})
	}
}

func TestIPAMRelease(t *testing.T) {
	h := startSystem(t, nil)
	ip := h.mustAllocate(t, ipam.IPv4, "ns/rel")

	release := func(t *testing.T, ip netip.Addr) *messages.IPAMReleased {
		t.Helper()
		return askAs[*messages.IPAMReleased](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMRelease{IP: ip})
	}
	t.Run("allocated", func(t *testing.T) {
		r := release(t, ip)
		if r.Err != nil || !r.Released || r.Owner != "ns/rel" {
			t.Fatalf("release %s = %+v", ip, r)
		}
		if _, ok := h.ix.IP(ip); ok {
			t.Fatalf("index still has %s after the reply", ip)
		}
	})
	t.Run("unallocated is a no-op", func(t *testing.T) {
		for _, s := range []string{ip.String(), "10.200.0.77", "fd00:200::77", "10.200.0.1"} {
			r := release(t, netip.MustParseAddr(s))
			if r.Err != nil || r.Released {
				t.Errorf("release %s = %+v, want a no-op", s, r)
			}
		}
	})
	t.Run("out of range", func(t *testing.T) {
		r := release(t, netip.MustParseAddr("192.168.0.1"))
		if !errors.Is(r.Err, ipam.ErrOutOfRange) {
			t.Fatalf("release out of range = %+v, want ErrOutOfRange", r)
		}
	})
	t.Run("claimed is refused", func(t *testing.T) {
		claimed := h.mustAllocate(t, ipam.IPv4, "ns/claimed")
		spec := podSpec(t, "claimed", "ns", "claimed")
		spec.IPv4 = claimed
		ep := h.mustCreate(t, spec)
		row, ok := h.ix.IP(claimed)
		if !ok || row.Endpoint != ep.ID || row.Holder == "" {
			t.Fatalf("claimed row %+v, %v; want endpoint %d with a holder", row, ok, ep.ID)
		}
		r := release(t, claimed)
		if !errors.Is(r.Err, actors.ErrIPInUse) || r.Released {
			t.Fatalf("release of a claimed address = %+v, want ErrIPInUse", r)
		}
		if _, ok := h.ix.IP(claimed); !ok {
			t.Fatalf("refused release removed the row")
		}
		forced := askAs[*messages.IPAMReleased](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMRelease{IP: claimed, Force: true})
		if forced.Err != nil || !forced.Released {
			t.Fatalf("forced release = %+v", forced)
		}
	})
	t.Run("released address is handed out again", func(t *testing.T) {
		got := askAs[*messages.IPAMAllocated](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMAllocateIP{IP: ip, Owner: "ns/again"})
		if got.Err != nil {
			t.Fatalf("allocate released %s: %v", ip, got.Err)
		}
	})
}

func TestIPAMExhaustion(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) {
		c.IPAM.IPv4 = netip.MustParsePrefix("10.9.0.0/29")  // .2 .. .6 allocatable
		c.IPAM.IPv6 = netip.MustParsePrefix("fd00:9::/126") // ::2, ::3
	})
	got := map[netip.Addr]bool{}
	for i := range 5 {
		ip := h.mustAllocate(t, ipam.IPv4, "ns/x")
		if got[ip] {
			t.Fatalf("allocation %d: %s handed out twice", i, ip)
		}
		got[ip] = true
	}
	r := h.allocate(t, ipam.IPv4, "ns/x")
	if !errors.Is(r.Err, ipam.ErrExhausted) {
		t.Fatalf("6th allocation = %+v, want ErrExhausted", r)
	}
	if n := len(h.ix.IPs("ipv4")); n != 5 {
		t.Fatalf("index holds %d IPv4 addresses, want 5", n)
	}

	// Both families: IPv6 still has room, IPv4 not; nothing leaks.
	before := len(h.ix.IPs("ipv6"))
	r = h.allocate(t, "", "ns/both")
	if !errors.Is(r.Err, ipam.ErrExhausted) {
		t.Fatalf("dual allocation with IPv4 full = %+v, want ErrExhausted", r)
	}
	if after := len(h.ix.IPs("ipv6")); after != before {
		t.Fatalf("failed dual allocation leaked an IPv6 address: %d -> %d", before, after)
	}

	// Releasing one makes room again.
	var one netip.Addr
	for ip := range got {
		one = ip
		break
	}
	if rel := askAs[*messages.IPAMReleased](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMRelease{IP: one}); rel.Err != nil || !rel.Released {
		t.Fatalf("release %s = %+v", one, rel)
	}
	if again := h.mustAllocate(t, ipam.IPv4, "ns/y"); again != one {
		t.Fatalf("after releasing %s got %s", one, again)
	}
}

func TestIPAMNoRange(t *testing.T) {
	h := startSystem(t, func(c *actors.Config) { c.IPAM.IPv6 = netip.Prefix{} })
	tests := []struct {
		name string
		msg  any
	}{
		{"ipv6 family", &messages.IPAMAllocate{Family: ipam.IPv6}},
		{"unknown family", &messages.IPAMAllocate{Family: "ipv5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := askAs[*messages.IPAMAllocated](t, h, h.sys.PIDForTest("ipam"), tt.msg)
			if !errors.Is(r.Err, actors.ErrNoRange) {
				t.Fatalf("answer %+v, want ErrNoRange", r)
			}
		})
	}
	r := h.allocate(t, "", "ns/only-v4")
	if r.Err != nil || !r.IPv4.IsValid() || r.IPv6.IsValid() {
		t.Fatalf("allocate all families with only IPv4 = %+v", r)
	}
	ip6 := askAs[*messages.IPAMAllocated](t, h, h.sys.PIDForTest("ipam"), &messages.IPAMAllocateIP{IP: netip.MustParseAddr("fd00::1")})
	if !errors.Is(ip6.Err, ipam.ErrOutOfRange) {
		t.Fatalf("allocate IPv6 without a range = %+v, want ErrOutOfRange", ip6)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  actors.Config
		want string // substring naming the bad field
	}{
		{"no range", actors.Config{}, "IPv4 or IPv6"},
		{"ipv4 holds ipv6", actors.Config{IPAM: actors.IPAMConfig{IPv4: testIPv6}}, "IPv4 range"},
		{"ipv6 holds ipv4", actors.Config{IPAM: actors.IPAMConfig{IPv6: testIPv4}}, "IPv6 range"},
		{"negative timeout", actors.Config{IPAM: actors.IPAMConfig{IPv4: testIPv4},
			Endpoint: actors.EndpointConfig{ProxyWaitTimeout: -1}}, "ProxyWaitTimeout"},
		{"too many workers", actors.Config{IPAM: actors.IPAMConfig{IPv4: testIPv4},
			Pool: actors.PoolConfig{Workers: 5000}}, "Workers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil {
				t.Fatalf("Validate() = nil")
			}
			if !errors.Is(err, actors.ErrInvalidConfig) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig", err)
			}
			if !containsFold(err.Error(), tt.want) {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.want)
			}
		})
	}
}
