package agent_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/health"
	"github.com/membrane-cni/membrane/pkg/clients/client"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

// waitHealth polls GET /v1/status until the health object has state.
func waitHealth(t *testing.T, c *client.Client, state string) *models.HealthStatus {
	t.Helper()
	var last *models.HealthStatus
	testutil.Eventually(t, "health "+state, func() bool {
		st, err := c.Status(context.Background())
		if err != nil || st.Health == nil {
			return false
		}
		last = st.Health
		return st.Health.State == state
	})
	return last
}

// TestHealthEndpoint: with the Linux datapath the agent runs a health
// endpoint (own netns, identity health) holding an address of every
// family the node serves, answering HTTP (probed on each) and ping from
// the host netns; after a restart and after a crash it is replaced by a
// new endpoint holding the same addresses, and the old one is gone. Runs
// dual-stack and on an IPv6-only node.
func TestHealthEndpoint(t *testing.T) {
	testutil.RequireRoot(t)
	t.Run("dual-stack", func(t *testing.T) { testHealthEndpoint(t, true) })
	t.Run("ipv6-only", func(t *testing.T) { testHealthEndpoint(t, false) })
}

func testHealthEndpoint(t *testing.T, v4 bool) {
	host := testutil.NewNS(t, "mbt-health")
	env := newRestoreEnv(t)
	if !v4 {
		env.cfg.IPv4Range = netip.Prefix{}
	}
	env.cfg.Datapath = "linux"
	// A bpffs of the test's own, so that nothing mounts one elsewhere.
	bpffs := t.TempDir()
	if err := unix.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(bpffs, unix.MNT_DETACH) })
	env.cfg.Linux = datapath.LinuxConfig{HostNetns: host.Path, BPFFS: bpffs, TeardownDelay: -1}
	env.cfg.EnableHealth, env.cfg.HealthInterval = true, 50*time.Millisecond
	env.cfg.GCInterval = 50 * time.Millisecond
	t.Cleanup(func() {
		p := filepath.Join(env.cfg.StateDir, "health", "netns")
		_ = unix.Unmount(p, unix.MNT_DETACH)
	})

	a, c := env.start(t, nil)
	h1 := waitHealth(t, c, health.StateOK)
	ep, err := c.EndpointGet(context.Background(), "container-id:"+health.ContainerID)
	if err != nil || ep.State != "ready" || ep.Identity == nil || ep.Identity.ID != 4 || ep.InterfaceName != health.HostIfName {
		t.Fatalf("health endpoint %+v, %v; want ready, identity 4 on %s", ep, err, health.HostIfName)
	}
	checkHealthAddrs(t, "first start", h1, ep, v4)
	pingHealth(t, "first start", host, h1)

	ep = healthVethVanishes(t, c, host, ep)

	restart := []struct {
		name string
		stop func(*agent.Agent)
	}{
		{"stop", func(a *agent.Agent) { stop(t, a) }},
		{"crash", func(a *agent.Agent) { a.Crash() }},
	}
	prev, prevEP := h1, ep
	for _, r := range restart {
		r.stop(a)
		var c2 *client.Client
		a, c2 = env.start(t, nil)
		h := waitHealth(t, c2, health.StateOK)
		ep, err := c2.EndpointGet(context.Background(), strconv.FormatInt(h.Endpoint, 10))
		if err != nil {
			t.Fatal(err)
		}
		// A new endpoint (the ID may be reused), the same addresses.
		if h.IP != prev.IP || h.IPv6 != prev.IPv6 || !ep.Created.After(prevEP.Created) || ep.ContainerID != health.ContainerID {
			t.Fatalf("after %s: health %+v on %+v, want IPs %s %s on an endpoint newer than %v", r.name, h, ep, prev.IP, prev.IPv6, prevEP.Created)
		}
		checkHealthAddrs(t, "after "+r.name, h, ep, v4)
		if eps, _ := c2.EndpointList(context.Background(), nil); len(eps) != 1 {
			t.Fatalf("after %s: %d endpoints, want only the new health endpoint", r.name, len(eps))
		}
		pingHealth(t, "after "+r.name, host, h)
		st, _ := c2.IPAMStatus(context.Background())
		for _, fam := range []*models.IPAMFamilyStatus{st.IPv4, st.IPv6} {
			if fam == nil {
				continue
			}
			for _, al := range fam.Allocations {
				if (al.IP == h.IP || al.IP == h.IPv6) && al.Endpoint != h.Endpoint {
					t.Fatalf("after %s: health address allocated to %+v", r.name, al)
				}
			}
		}
		prev, prevEP = h, ep
	}
}

// checkHealthAddrs: the status names the endpoint and its addresses: the
// IPv4 and IPv6 one on a dual-stack node, the IPv6 one as "ip" on an
// IPv6-only node.
func checkHealthAddrs(t *testing.T, when string, h *models.HealthStatus, ep *models.Endpoint, v4 bool) {
	t.Helper()
	a := ep.Addressing
	ok := h.Endpoint == ep.ID && a != nil && a.IPv6 != ""
	if v4 {
		ok = ok && a.IPv4 != "" && h.IP == a.IPv4 && h.IPv6 == a.IPv6
	} else {
		ok = ok && a.IPv4 == "" && h.IP == a.IPv6 && h.IPv6 == ""
	}
	if !ok {
		t.Fatalf("%s: status %+v does not match endpoint %d %+v (ipv4 served: %v)", when, h, ep.ID, a, v4)
	}
}

// pingHealth pings each of the health endpoint's addresses from the host.
func pingHealth(t *testing.T, when string, host *testutil.NS, h *models.HealthStatus) {
	t.Helper()
	for _, ip := range []string{h.IP, h.IPv6} {
		if ip == "" {
			continue
		}
		if out, err := host.Exec("ping", "-c", "1", "-W", "2", ip); err != nil {
			t.Fatalf("%s: ping health endpoint %s from the host netns: %v\n%s", when, ip, err, out)
		}
	}
}

// healthVethVanishes deletes the health endpoint's host veth: the garbage
// collector deletes the endpoint and the agent sets a new one up on the
// same address, which it returns.
func healthVethVanishes(t *testing.T, c *client.Client, host *testutil.NS, ep *models.Endpoint) *models.Endpoint {
	t.Helper()
	nl := host.Netlink(t)
	link, err := nl.LinkByName(health.HostIfName)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	var cur *models.Endpoint
	testutil.Eventually(t, "a new health endpoint", func() bool {
		st, err := c.Status(context.Background())
		if err != nil || st.Health == nil || st.Health.State != health.StateOK {
			return false
		}
		cur, err = c.EndpointGet(context.Background(), "container-id:"+health.ContainerID)
		return err == nil && cur.Created.After(ep.Created) && cur.State == "ready"
	})
	if *cur.Addressing != *ep.Addressing {
		t.Fatalf("health endpoint moved from %+v to %+v after its veth vanished", ep.Addressing, cur.Addressing)
	}
	return cur
}
