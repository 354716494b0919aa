package nodeharness

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

// Pod is a sandbox on a node: its netns and the runtime's view of it.
type Pod struct {
	// Namespace and Name are the pod's Kubernetes namespace and name.
	Namespace, Name string
	// NS is the pod's netns.
	NS *testutil.NS
	// RT is what the runtime passes to the plugin (CNI_ARGS included).
	RT *libcni.RuntimeConf
	// IPv4 and IPv6 are the addresses of the last successful Add
	// (invalid: none of that family).
	IPv4, IPv6 netip.Addr
}

// RuntimeConf is a runtime's configuration of attachment eth0 of
// container id in netns for pod namespace/name, with the CNI_ARGS
// kubelet passes.
func RuntimeConf(id, netns, namespace, name string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: id, NetNS: netns, IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", id}, {"K8S_POD_UID", "uid-" + namespace + "-" + name}}}
}

// NewPod makes the netns of pod default/name (removed at cleanup) and
// its runtime config; nothing is added.
func (n *Node) NewPod(name string) *Pod { return n.NewPodIn("default", name) }

// NewPodIn is NewPod in Kubernetes namespace namespace. Safe from any
// goroutine.
func (n *Node) NewPodIn(namespace, name string) *Pod {
	ns := testutil.NewNS(n.tb, "mbt-pod")
	return &Pod{Namespace: namespace, Name: name, NS: ns, RT: RuntimeConf("c"+testutil.RandomSuffix(24), ns.Path, namespace, name)}
}

// AddPod makes pod default/name, adds it and registers its DEL, which
// runs before its netns goes.
func (n *Node) AddPod(name string) *Pod { return n.AddPodIn("default", name) }

// AddPodIn is AddPod in Kubernetes namespace namespace.
func (n *Node) AddPodIn(namespace, name string) *Pod {
	n.tb.Helper()
	p := n.NewPodIn(namespace, name)
	n.MustAdd(p)
	n.DelAtCleanup(p)
	return p
}

// DelAtCleanup registers p's DEL at cleanup, before the netns's removal
// if p was made after it (cleanups run last-in first-out); a DEL failing
// while the node's agent runs fails the test.
func (n *Node) DelAtCleanup(p *Pod) {
	n.tb.Cleanup(func() {
		if err := n.Del(p); err != nil && n.agentRunning() {
			n.tb.Errorf("DEL %s/%s: %v", p.Namespace, p.Name, err)
		}
	})
}

func (n *Node) agentRunning() bool {
	if n.Agent != nil {
		return true
	}
	for _, p := range n.procs {
		if p.Running() {
			return true
		}
	}
	return false
}

// Add runs the plugin's ADD for p in the node's netns and records its
// addresses.
func (n *Node) Add(p *Pod) (*types100.Result, error) {
	var res *types100.Result
	err := n.Do(func(ctx context.Context) error {
		var err error
		res, err = n.AddRT(ctx, p.RT)
		return err
	})
	if err != nil {
		return nil, err
	}
	p.IPv4, p.IPv6 = Addrs(res)
	return res, nil
}

// MustAdd is Add, failing the test on an error.
func (n *Node) MustAdd(p *Pod) *types100.Result {
	n.tb.Helper()
	res, err := n.Add(p)
	if err != nil {
		n.tb.Fatalf("ADD %s/%s (%s): %v", p.Namespace, p.Name, p.RT.ContainerID, err)
	}
	return res
}

// Del runs the plugin's DEL for p in the node's netns.
func (n *Node) Del(p *Pod) error {
	return n.Do(func(ctx context.Context) error { return n.DelRT(ctx, p.RT) })
}

// Check runs the plugin's CHECK for p.
func (n *Node) Check(p *Pod) error {
	return n.Do(func(ctx context.Context) error { return n.cni.CheckNetworkList(ctx, n.Conf, p.RT) })
}

// Status runs the plugin's STATUS.
func (n *Node) Status() error {
	return n.Do(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, n.Conf) })
}

// GC runs the plugin's GC with valid as the attachments to keep.
func (n *Node) GC(valid ...*Pod) error {
	args := &libcni.GCArgs{}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.RT.ContainerID, IfName: p.RT.IfName})
	}
	return n.Do(func(ctx context.Context) error { return n.cni.GCNetworkList(ctx, n.Conf, args) })
}

// AddRT runs ADD for rt; the caller is on a thread in the node's netns
// (Do) or the node is the test's own.
func (n *Node) AddRT(ctx context.Context, rt *libcni.RuntimeConf) (*types100.Result, error) {
	r, err := n.cni.AddNetworkList(ctx, n.Conf, rt)
	if err != nil {
		return nil, err
	}
	return types100.NewResultFromResult(r)
}

// AddRTDiscarded runs ADD as AddRT but keeps its result out of the
// node's result cache, as a runtime that gave up on the call discards
// its answer: a later CHECK or DEL sees only the ADDs the runtime kept,
// whichever plugin process happened to exit last.
func (n *Node) AddRTDiscarded(ctx context.Context, rt *libcni.RuntimeConf) (*types100.Result, error) {
	r, err := n.discard.AddNetworkList(ctx, n.Conf, rt)
	if err != nil {
		return nil, err
	}
	return types100.NewResultFromResult(r)
}

// DelRT runs DEL for rt, as AddRT.
func (n *Node) DelRT(ctx context.Context, rt *libcni.RuntimeConf) error {
	return n.cni.DelNetworkList(ctx, n.Conf, rt)
}

// Addrs are the result's IPv4 and IPv6 addresses (invalid: none).
func Addrs(res *types100.Result) (v4, v6 netip.Addr) {
	for _, ipc := range res.IPs {
		a, _ := netip.AddrFromSlice(ipc.Address.IP)
		if a = a.Unmap(); a.Is4() && !v4.IsValid() {
			v4 = a
		} else if a.Is6() && !v6.IsValid() {
			v6 = a
		}
	}
	return v4, v6
}

// Code is the CNI error code of err (0: not a CNI error).
func Code(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// String is the pod's namespace/name.
func (p *Pod) String() string { return fmt.Sprintf("%s/%s", p.Namespace, p.Name) }
