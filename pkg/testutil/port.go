package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// Ports handed out by FreePort lie below Linux's default ephemeral range
// (net.ipv4.ip_local_port_range 32768-60999), so no outgoing connection
// on the machine takes one as its source port between the check and the
// caller's own bind, and are random, so suites running at the same time
// on this machine rarely try the same one.
const (
	freePortMin = 20000
	freePortMax = 32000
)

// FreePort returns a TCP port on host (an address, e.g. "127.0.0.1")
// that nothing listened on a moment ago, for a process the caller starts
// and that binds it itself (etcd, kube-apiserver). A caller that can,
// should rather listen on port 0 and pass the listener on.
func FreePort(host string) (int, error) {
	for range 64 {
		port := freePortMin + rand.IntN(freePortMax-freePortMin)
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	return 0, fmt.Errorf("no free TCP port on %s in %d-%d", host, freePortMin, freePortMax)
}
