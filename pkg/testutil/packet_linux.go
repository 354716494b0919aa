package testutil

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// SendFrame writes frame as is (its Ethernet header included) on the
// interface ifname inside ns, through an AF_PACKET raw socket: what a
// process with CAP_NET_RAW in a pod can send, VLAN tags and any source
// address included.
func SendFrame(ns *NS, ifname string, frame []byte) error {
	return ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return fmt.Errorf("send frame: %w", err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0) // protocol 0: send only
		if err != nil {
			return fmt.Errorf("send frame: packet socket: %w", err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(sa.Addr[:], frame[:6])
		if err := unix.Sendto(fd, frame, 0, sa); err != nil {
			return fmt.Errorf("send frame on %s: %w", ifname, err)
		}
		return nil
	})
}
