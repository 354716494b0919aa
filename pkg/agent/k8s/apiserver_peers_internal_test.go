package k8s

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// peerSink records what syncAPIServer gives the sink; the other methods
// are not called (nil interface: a call panics).
type peerSink struct {
	ServiceSink
	addrs []netip.Addr
	peers []netip.AddrPort
}

func (s *peerSink) SetKubeAPIServerAddrs(addrs []netip.Addr)     { s.addrs = addrs }
func (s *peerSink) SetKubeAPIServerPeers(peers []netip.AddrPort) { s.peers = peers }

// TestSyncAPIServerPeers: the API server's own EndpointSlice
// (default/kubernetes) gives the host firewall's safety net each address
// with each TCP port, following its changes; a slice of another name or
// namespace does not count; no slice, no peers.
func TestSyncAPIServerPeers(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	sink := &peerSink{}
	w := &ServiceWatcher{sink: sink, slices: discoverylisters.NewEndpointSliceLister(idx)}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	port := func(p int32, proto *corev1.Protocol) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Port: &p, Protocol: proto}
	}
	slice := func(ns, name string, addrs []string, ports ...discoveryv1.EndpointPort) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: addrs}}, Ports: ports}
	}
	check := func(what string, want ...string) {
		t.Helper()
		w.syncAPIServer()
		var got []string
		for _, p := range sink.peers {
			got = append(got, p.String())
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: peers %v, want %v", what, got, want)
		}
	}
	check("no slice")
	if err := idx.Add(slice("other", "kubernetes", []string{"192.0.2.99"}, port(6443, &tcp))); err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(slice("default", "kubernetes-extra", []string{"192.0.2.98"}, port(6443, &tcp))); err != nil {
		t.Fatal(err)
	}
	check("slices not the API server's")
	own := slice("default", "kubernetes", []string{"192.0.2.10", "192.0.2.11"}, port(6443, &tcp), port(53, &udp))
	if err := idx.Add(own); err != nil {
		t.Fatal(err)
	}
	check("the API server's slice", "192.0.2.10:6443", "192.0.2.11:6443")
	if err := idx.Update(slice("default", "kubernetes", []string{"192.0.2.12"}, port(443, nil))); err != nil {
		t.Fatal(err)
	}
	check("the slice changed", "192.0.2.12:443")
	if err := idx.Delete(own); err != nil {
		t.Fatal(err)
	}
	check("the slice deleted")
}
