package service

import (
	"errors"
	"net/netip"
	"testing"
)

func TestHostPortParse(t *testing.T) {
	for _, h := range []HostPort{
		{Port: 80, ContainerPort: 8080, Proto: TCP},
		{HostIP: netip.MustParseAddr("10.0.0.1"), Port: 53, ContainerPort: 5353, Proto: UDP},
		{HostIP: netip.MustParseAddr("fd00::1"), Port: 65535, ContainerPort: 1, Proto: TCP},
		{HostIP: netip.MustParseAddr("127.0.0.1"), Port: 80, ContainerPort: 80, Proto: TCP}, // the node's localhost
		{HostIP: netip.MustParseAddr("::1"), Port: 80, ContainerPort: 80, Proto: UDP},
	} {
		got, err := ParseHostPort(h.String())
		if err != nil || got != h {
			t.Errorf("ParseHostPort(%q) = %+v, %v; want %+v", h.String(), got, err, h)
		}
	}
	for _, s := range []string{"", "80/TCP", "0/TCP=80", "80/TCP=0", "80/SCTP=80", "80/ICMP=80", "080/TCP=80",
		"0.0.0.0:80/TCP=80", "[::]:80/TCP=80", "[fe80::1%eth0]:80/TCP=80", "[::ffff:10.0.0.1]:80/TCP=80", "224.0.0.1:80/UDP=80", "80/TCP=65536"} {
		if _, err := ParseHostPort(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseHostPort(%q) = %v, want ErrInvalid", s, err)
		}
	}
}

func TestHostPortOverlaps(t *testing.T) {
	a := netip.MustParseAddr("10.0.0.1")
	b := netip.MustParseAddr("10.0.0.2")
	for _, tc := range []struct {
		h, o HostPort
		want bool
	}{
		{HostPort{Port: 80, Proto: TCP}, HostPort{Port: 80, Proto: TCP}, true},
		{HostPort{Port: 80, Proto: TCP}, HostPort{Port: 80, Proto: UDP}, false},
		{HostPort{Port: 80, Proto: TCP}, HostPort{HostIP: a, Port: 80, Proto: TCP}, true},
		{HostPort{HostIP: a, Port: 80, Proto: TCP}, HostPort{HostIP: b, Port: 80, Proto: TCP}, false},
		{HostPort{HostIP: a, Port: 80, Proto: TCP}, HostPort{HostIP: a, Port: 81, Proto: TCP}, false},
	} {
		if got := tc.h.Overlaps(tc.o); got != tc.want || tc.o.Overlaps(tc.h) != tc.want {
			t.Errorf("%s overlaps %s = %v, want %v (both ways)", tc.h, tc.o, got, tc.want)
		}
	}
}
