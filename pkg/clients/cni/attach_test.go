package cni

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/cni/skel"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// TestBuildResultFromAttach: the plugin takes every family the agent
// answered, IPv4 first, and refuses an answer without an address, with an
// address or gateway of the wrong family, with a MAC that does not parse
// or with a host interface other than the attachment's.
func TestBuildResultFromAttach(t *testing.T) {
	args := &skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Netns: "/run/netns/p"}
	host, _ := VethNames("c1", "eth0")
	v4 := &models.AttachAddress{IP: "10.0.0.2", Gateway: "10.0.0.1"}
	v6 := &models.AttachAddress{IP: "fd00::2", Gateway: "fd00::1"}
	good := func(mod func(*models.AttachResponse)) models.AttachResponse {
		r := models.AttachResponse{EndpointID: 7,
			HostInterface: models.AttachInterface{Name: host, Index: 9, Mac: "02:00:00:00:00:01"},
			PodInterface:  models.AttachInterface{Name: "eth0", Index: 2, Mac: "02:00:00:00:00:02"}}
		mod(&r)
		return r
	}
	tests := []struct {
		name string
		res  models.AttachResponse
		want []string // addresses in the result; nil: an error
	}{
		{"dual-stack", good(func(r *models.AttachResponse) { r.IPv4, r.IPv6 = v4, v6 }), []string{"10.0.0.2/32", "fd00::2/128"}},
		{"ipv4 only", good(func(r *models.AttachResponse) { r.IPv4 = v4 }), []string{"10.0.0.2/32"}},
		{"ipv6 only", good(func(r *models.AttachResponse) { r.IPv6 = v6 }), []string{"fd00::2/128"}},
		{"nothing", good(func(*models.AttachResponse) {}), nil},
		{"ipv6 in the ipv4 slot", good(func(r *models.AttachResponse) { r.IPv4 = v6 }), nil},
		{"ipv4 gateway for ipv6", good(func(r *models.AttachResponse) {
			r.IPv4, r.IPv6 = v4, &models.AttachAddress{IP: "fd00::2", Gateway: "10.0.0.1"}
		}), nil},
		{"bad ipv6", good(func(r *models.AttachResponse) { r.IPv6 = &models.AttachAddress{IP: "fd00::zz", Gateway: "fd00::1"} }), nil},
		{"bad MAC", good(func(r *models.AttachResponse) { r.IPv4, r.PodInterface.Mac = v4, "nope" }), nil},
		{"another host interface", good(func(r *models.AttachResponse) { r.IPv4, r.HostInterface.Name = v4, "lxc000000000000" }), nil},
	}
	conf := &NetConf{MTU: 1500}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := buildResult(conf, args, &tt.res)
			if (err != nil) != (tt.want == nil) {
				t.Fatalf("err = %v, want error %v", err, tt.want == nil)
			}
			if err != nil {
				return
			}
			var got []string
			for _, ip := range res.IPs {
				got = append(got, ip.Address.String())
				if ip.Gateway.To4() == nil != (ip.Address.IP.To4() == nil) {
					t.Fatalf("address %s with gateway %s", ip.Address.String(), ip.Gateway)
				}
			}
			if len(got) != len(tt.want) || len(res.Routes) != 2*len(tt.want) {
				t.Fatalf("addresses %v and %d routes, want %v", got, len(res.Routes), tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("addresses %v, want %v", got, tt.want)
				}
			}
			if res.Interfaces[0].Name != host || res.Interfaces[1].Sandbox != args.Netns {
				t.Fatalf("interfaces %+v %+v", res.Interfaces[0], res.Interfaces[1])
			}
		})
	}
}
