package datapath

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// IPv4 device configuration indexes (IPV4_DEVCONF_* in
// include/uapi/linux/ip.h), one per net.ipv4.conf.<dev> sysctl: RTM_NEWLINK's
// IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF holds their values as an array
// of u32, the value of index i at i-1.
var ipv4Devconf = map[string]uint16{
	"forwarding":   1,
	"rp_filter":    8,
	"accept_local": 23,
}

// openDevconf opens the netlink socket hostSysctlsHold reads through, in
// the host netns h.
func openDevconf(h netns.NsHandle) (*nl.SocketHandle, error) {
	s, err := nl.GetNetlinkSocketAt(h, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("linux datapath init: netlink socket for device sysctls: %w", err)
	}
	if err := s.SetReceiveTimeout(&devconfTimeout); err != nil {
		s.Close()
		return nil, fmt.Errorf("linux datapath init: netlink socket for device sysctls: %w", err)
	}
	return &nl.SocketHandle{Socket: s}, nil
}

// nlaTypeMask is an attribute's type without the nested and
// byte-order flags.
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

// devconfTimeout bounds the wait for the kernel's answer to RTM_GETLINK.
var devconfTimeout = unix.NsecToTimeval(sysctlTimeout.Nanoseconds())

// hostSysctlsHold reports whether the interface index, called name,
// already has every IPv4 sysctl of want (name to value): one RTM_GETLINK
// through the datapath's socket in the host netns, whose answer carries
// every net.ipv4.conf.<dev> value, instead of reading /proc/sys from a
// thread in the host netns. false (nil error) means "look closer":
// a value differs, or the kernel's answer is not one it can judge (no
// such index, another name, no IPv4 configuration).
func (l *Linux) hostSysctlsHold(index int, name string, want map[string]string) (bool, error) {
	if l.devconf == nil {
		return false, nil
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, 0)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: l.devconf} // numbers and locks the request
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if errors.Is(err, unix.ENODEV) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the sysctls of %s: %w", name, err)
	}
	if len(msgs) != 1 {
		return false, nil
	}
	conf, ok := parseIPv4Devconf(msgs[0], name)
	if !ok {
		return false, nil
	}
	for key, value := range want {
		idx, known := ipv4Devconf[key]
		v, present := conf[idx]
		if !known || !present || strconv.FormatUint(uint64(v), 10) != value {
			return false, nil
		}
	}
	return true, nil
}

// parseIPv4Devconf returns the IPv4 device configuration in an
// RTM_NEWLINK payload by IPV4_DEVCONF index, if the link is called name
// and has one.
func parseIPv4Devconf(payload []byte, name string) (map[uint16]uint32, bool) {
	if len(payload) < unix.SizeofIfInfomsg {
		return nil, false
	}
	attrs, err := nl.ParseRouteAttr(payload[unix.SizeofIfInfomsg:])
	if err != nil {
		return nil, false
	}
	var named bool
	var conf map[uint16]uint32
	for _, a := range attrs {
		switch a.Attr.Type & nlaTypeMask {
		case unix.IFLA_IFNAME:
			named = string(trimNUL(a.Value)) == name
		case unix.IFLA_AF_SPEC:
			conf = afInetConf(a.Value)
		}
	}
	return conf, named && conf != nil
}

// afInetConf finds AF_INET / IFLA_INET_CONF in an IFLA_AF_SPEC value.
func afInetConf(spec []byte) map[uint16]uint32 {
	families, err := nl.ParseRouteAttr(spec)
	if err != nil {
		return nil
	}
	for _, f := range families {
		if f.Attr.Type&nlaTypeMask != unix.AF_INET {
			continue
		}
		inet, err := nl.ParseRouteAttr(f.Value)
		if err != nil {
			return nil
		}
		for _, c := range inet {
			if c.Attr.Type&nlaTypeMask != unix.IFLA_INET_CONF {
				continue
			}
			// An array of u32, IPV4_DEVCONF_* - 1 each (inet_fill_link_af).
			conf := make(map[uint16]uint32, len(c.Value)/4)
			for i := 0; i+4 <= len(c.Value); i += 4 {
				conf[uint16(i/4+1)] = nl.NativeEndian().Uint32(c.Value[i:])
			}
			return conf
		}
	}
	return nil
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
