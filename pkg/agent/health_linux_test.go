package agent_test

import (
	"context"
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
	eventuallyT(t, "health "+state, func() bool {
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
// endpoint (own netns, identity health) that answers HTTP and ping from
// the host netns; after a restart and after a crash it is replaced by a
// new endpoint holding the same address, and the old one is gone.
func TestHealthEndpoint(t *testing.T) {
	testutil.RequireRoot(t)
	host := testutil.NewNS(t, "mbt-health")
	env := newRestoreEnv(t)
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
	if h1.IP != ep.Addressing.IPv4 || h1.Endpoint != ep.ID {
		t.Fatalf("status %+v does not match endpoint %d %s", h1, ep.ID, ep.Addressing.IPv4)
	}
	if out, err := host.Exec("ping", "-c", "1", "-W", "2", h1.IP); err != nil {
		t.Fatalf("ping health endpoint from the host netns: %v\n%s", err, out)
	}

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
		// A new endpoint (the ID may be reused), the same address.
		if h.IP != prev.IP || !ep.Created.After(prevEP.Created) || ep.ContainerID != health.ContainerID {
			t.Fatalf("after %s: health %+v on %+v, want IP %s on an endpoint newer than %v", r.name, h, ep, prev.IP, prevEP.Created)
		}
		if eps, _ := c2.EndpointList(context.Background(), nil); len(eps) != 1 {
			t.Fatalf("after %s: %d endpoints, want only the new health endpoint", r.name, len(eps))
		}
		if out, err := host.Exec("ping", "-c", "1", "-W", "2", h.IP); err != nil {
			t.Fatalf("after %s: ping health endpoint: %v\n%s", r.name, err, out)
		}
		st, _ := c2.IPAMStatus(context.Background())
		for _, al := range st.IPv4.Allocations {
			if al.IP == h.IP && al.Endpoint != h.Endpoint {
				t.Fatalf("after %s: health address allocated to %+v", r.name, al)
			}
		}
		prev, prevEP = h, ep
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
	eventuallyT(t, "a new health endpoint", func() bool {
		st, err := c.Status(context.Background())
		if err != nil || st.Health == nil || st.Health.State != health.StateOK {
			return false
		}
		cur, err = c.EndpointGet(context.Background(), "container-id:"+health.ContainerID)
		return err == nil && cur.Created.After(ep.Created) && cur.State == "ready"
	})
	if cur.Addressing.IPv4 != ep.Addressing.IPv4 {
		t.Fatalf("health endpoint moved from %s to %s after its veth vanished", ep.Addressing.IPv4, cur.Addressing.IPv4)
	}
	return cur
}
