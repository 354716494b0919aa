package proxy

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/datapath/l7proxy/xdsapi"

	"github.com/membrane-cni/membrane/datapath/l7proxy"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// TestVerdict: ingress rules of the destination and egress rules of the
// source must both allow; a connection neither side redirects is denied;
// peers are found by longest prefix in the ipcache.
func TestVerdict(t *testing.T) {
	a, b, c := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.4"), netip.MustParseAddr("10.0.1.3")
	egress := &l7proxy.EndpointPolicy{ID: 1, IPs: []netip.Addr{a}, L7: []policy.L7Entry{
		{Key: policy.Key{Identity: idB, Port: 80, Proto: policy.ProtoTCP, Dir: policy.Egress}, HTTP: []policy.HTTPRule{{Method: "GET"}}}}}
	ingress := &l7proxy.EndpointPolicy{ID: 2, IPs: []netip.Addr{b}, L7: []policy.L7Entry{
		{Key: policy.Key{Port: 80, Proto: policy.ProtoTCP, Dir: policy.Ingress}, HTTP: []policy.HTTPRule{{Path: "/public"}}}}}
	st := &state{byIP: map[netip.Addr]*compiledEndpoint{},
		ipcache: ipcacheOf(map[netip.Prefix]identity.NumericIdentity{
			netip.MustParsePrefix("10.0.0.2/32"): idA, netip.MustParsePrefix("10.0.0.4/32"): idB, netip.MustParsePrefix("10.0.1.0/24"): idC})}
	for _, ep := range []*l7proxy.EndpointPolicy{egress, ingress} {
		ce, err := compileEndpoint(ep, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ip := range ep.IPs {
			st.byIP[ip] = ce
		}
	}
	if id := st.identityOf(c); id != idC {
		t.Errorf("identityOf(%s) = %d, want %d (the /24)", c, id, idC)
	}
	if id := st.identityOf(netip.MustParseAddr("192.0.2.1")); id != identity.ReservedWorld {
		t.Errorf("unknown address: identity %d, want world", id)
	}
	tests := []struct {
		name     string
		src, dst netip.Addr
		port     uint16
		method   string
		path     string
		want     bool
	}{
		{"both allow", a, b, 80, "GET", "/public", true},
		{"egress denies POST", a, b, 80, "POST", "/public", false},
		{"ingress denies path", a, b, 80, "GET", "/private", false},
		{"ingress only (any peer)", c, b, 80, "POST", "/public", true},
		{"egress to a peer without ingress rules", a, c, 80, "GET", "/x", false}, // A's egress rule names B only
		{"not redirected", c, a, 8080, "GET", "/", false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest(tt.method, "http://x"+tt.path, nil)
		r.Header = http.Header{}
		if d := st.verdict(tt.src, tt.dst, tt.port, r); d.allowed != tt.want {
			t.Errorf("%s: verdict = %v (%s), want %v", tt.name, d.allowed, d.reason, tt.want)
		}
	}
}

// ipcacheOf is entries as a state holds them: by shard.
func ipcacheOf(entries map[netip.Prefix]identity.NumericIdentity) [xdsapi.IPCacheShards]map[netip.Prefix]identity.NumericIdentity {
	var out [xdsapi.IPCacheShards]map[netip.Prefix]identity.NumericIdentity
	for k, c := range xdsapi.SplitIPCache(entries) {
		out[k] = c.Entries
	}
	return out
}
