package datapath_test

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/clients/cni"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/test/nodeharness"
)

func TestMain(m *testing.M) { os.Exit(nodeharness.Main(m)) }

// newEnv is a node with an IPv4 range and no agent yet.
func newEnv(t *testing.T, cidr string) *nodeharness.Node { return newEnvStack(t, cidr, "") }

// newEnvStack is newEnv with an IPv4 range, an IPv6 range or both (""
// leaves a family out).
func newEnvStack(t *testing.T, cidr, cidr6 string) *nodeharness.Node {
	t.Helper()
	return nodeharness.New(t, nodeharness.Options{Prefix: "mbt-host", IPv4Range: cidr, IPv6Range: cidr6, MTU: 1400, Debug: true})
}

// startAgent starts the node's in-process agent with a short teardown
// delay and a garbage collector pass every second; mod may change the
// config further (e.g. to the fake datapath).
func startAgent(e *nodeharness.Node, mod func(*agent.Config)) {
	e.StartAgent(func(c *agent.Config) {
		c.Linux.TeardownDelay, c.GCInterval = 200*time.Millisecond, time.Second
		if mod != nil {
			mod(c)
		}
	})
}

// hostLinkExists reports whether the pod's lxc device exists in the
// node's netns.
func hostLinkExists(t *testing.T, e *nodeharness.Node, p *nodeharness.Pod) bool {
	t.Helper()
	name, _ := cni.VethNames(p.RT.ContainerID, p.RT.IfName)
	_, err := e.NS.Netlink(t).LinkByName(name)
	return err == nil
}

// allocated reports whether ip is allocated in the agent's IPAM.
func allocated(t *testing.T, e *nodeharness.Node, ip netip.Addr) bool {
	t.Helper()
	for _, a := range allocations(t, e) {
		if a.IP == ip.String() {
			return true
		}
	}
	return false
}

// allocations returns every allocation of GET /v1/ipam, both families.
func allocations(t *testing.T, e *nodeharness.Node) []models.IPAMAllocation {
	t.Helper()
	st, err := e.Client().IPAMStatus(context.Background())
	if err != nil {
		t.Fatalf("ipam status: %v", err)
	}
	var all []models.IPAMAllocation
	for _, fam := range []*models.IPAMFamilyStatus{st.IPv4, st.IPv6} {
		if fam != nil {
			all = append(all, fam.Allocations...)
		}
	}
	return all
}
