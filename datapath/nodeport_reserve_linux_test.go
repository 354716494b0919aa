package datapath

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/datapath/sysctl"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// TestProtectNodePortRange: with the ephemeral ports overlapping the
// NodePort range, the range is reserved (what was reserved stays) and no
// socket gets a port in it; a second run changes nothing; ephemeral
// ports clear of the range leave the reservations alone.
func TestProtectNodePortRange(t *testing.T) {
	testutil.RequireRoot(t)
	ns := testutil.NewNS(t, "mbt-npres")
	read := func(name string) (string, error) {
		b, err := os.ReadFile(sysctl.Path(name))
		return strings.TrimSpace(string(b)), err
	}
	write := func(name, v string) error { return os.WriteFile(sysctl.Path(name), []byte(v), 0o644) }
	r := DefaultNodePortRange
	// fn runs on the namespace's own thread: it returns its findings
	// (t.Fatal there would end that goroutine, not the test).
	if err := ns.Do(func() error {
		if err := write("net/ipv4/ip_local_port_range", "30000 40000"); err != nil {
			return err
		}
		if err := write("net/ipv4/ip_local_reserved_ports", "8080"); err != nil {
			return err
		}
		if changed, err := protectNodePortRange(r); err != nil || !changed {
			return fmt.Errorf("first run: changed %v, err %v", changed, err)
		}
		if got, err := read("net/ipv4/ip_local_reserved_ports"); err != nil || got != "8080,30000-32767" {
			return fmt.Errorf("reserved %q (%v), want 8080,30000-32767", got, err)
		}
		for range 200 { // about a quarter would land in the range unreserved
			c, err := net.ListenPacket("udp4", "127.0.0.1:0")
			if err != nil {
				return err
			}
			port := c.LocalAddr().(*net.UDPAddr).Port
			c.Close()
			if port >= int(r[0]) && port <= int(r[1]) {
				return fmt.Errorf("a socket got port %d, a NodePort", port)
			}
		}
		if changed, err := protectNodePortRange(r); err != nil || changed {
			return fmt.Errorf("second run: changed %v, err %v", changed, err)
		}
		if err := write("net/ipv4/ip_local_reserved_ports", "\n"); err != nil {
			return err
		}
		if err := write("net/ipv4/ip_local_port_range", "32768 60999"); err != nil {
			return err
		}
		if changed, err := protectNodePortRange(r); err != nil || changed {
			return fmt.Errorf("clear ephemeral range: changed %v, err %v", changed, err)
		}
		if got, err := read("net/ipv4/ip_local_reserved_ports"); err != nil || got != "" {
			return fmt.Errorf("reserved %q (%v) with the ephemeral ports clear of the range", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestReservedCovers(t *testing.T) {
	r := [2]uint16{30000, 32767}
	for list, want := range map[string]bool{"": false, "30000-32767": true, "8080,29000-33000": true, "30000-32000,32001-32767": false,
		"30000": false, "x-y": false} {
		if got := reservedCovers(list, r); got != want {
			t.Errorf("reservedCovers(%q) = %v, want %v", list, got, want)
		}
	}
}
