package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/membrane-cni/membrane/datapath"
)

// NodeSource is the source name under which the Kubernetes Node objects
// reach the node sink.
const NodeSource = "k8s"

// NodeSink takes the full set of other nodes from one source
// (*actors.System's SyncNodes once the cross-node datapath is merged).
type NodeSink interface {
	SyncNodes(ctx context.Context, source string, nodes []datapath.RemoteNode) error
}

// The Node annotations in which each agent publishes its health
// endpoint's addresses (Cilium's network.cilium.io/ipv4-health-ip and
// ipv6-health-ip). The other agents believe them only inside the Node's
// spec.podCIDRs (the nodes actor, endpoint.CheckHealthIPs).
const (
	HealthIPv4Annotation = "network.membrane.io/ipv4-health-ip"
	HealthIPv6Annotation = "network.membrane.io/ipv6-health-ip"
)

// HealthIPs returns the health endpoint addresses node's annotations
// publish (IPv4 first); an annotation that is not an address of its
// family is left out and returned in bad.
func HealthIPs(node *corev1.Node) (ips []netip.Addr, bad []string) {
	for _, k := range []string{HealthIPv4Annotation, HealthIPv6Annotation} {
		v, ok := node.Annotations[k]
		if !ok || v == "" {
			continue
		}
		ip, err := netip.ParseAddr(v)
		if err != nil || ip.Zone() != "" || (k == HealthIPv4Annotation) != ip.Unmap().Is4() {
			bad = append(bad, k+"="+v)
			continue
		}
		ips = append(ips, ip.Unmap())
	}
	return ips, bad
}

// ErrNoPodCIDRs is returned by WaitPodCIDRs when the node got no
// spec.podCIDRs in time.
var ErrNoPodCIDRs = errors.New("node has no spec.podCIDRs")

// nodeCoalesce gathers a burst of node changes into one SyncNodes.
const nodeCoalesce = 200 * time.Millisecond

// PodCIDRs returns node's pod CIDRs (spec.podCIDRs, else spec.podCIDR),
// at most one per family, IPv4 first. Returns an error naming the field
// for a CIDR that does not parse.
func PodCIDRs(node *corev1.Node) (v4, v6 netip.Prefix, err error) {
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return v4, v6, fmt.Errorf("node %s: spec.podCIDRs: %w", node.Name, err)
		}
		p = p.Masked()
		switch {
		case p.Addr().Is4() && !v4.IsValid():
			v4 = p
		case p.Addr().Is6() && !v6.IsValid():
			v6 = p
		}
	}
	return v4, v6, nil
}

// InternalIPs returns node's InternalIP addresses (status.addresses), at
// most one per family, IPv4 first.
func InternalIPs(node *corev1.Node) []netip.Addr {
	var v4, v6 netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		if ip.Is4() && !v4.IsValid() {
			v4 = ip
		} else if ip.Is6() && !v6.IsValid() {
			v6 = ip
		}
	}
	var out []netip.Addr
	for _, ip := range []netip.Addr{v4, v6} {
		if ip.IsValid() {
			out = append(out, ip)
		}
	}
	return out
}

// NodeInternalIPs reads this node's Node object once and returns its
// InternalIPs (InternalIPs), as Cilium takes the node's address from it.
func NodeInternalIPs(ctx context.Context, cfg Config) ([]netip.Addr, error) {
	_, cs, err := cfg.clientset("node addresses")
	if err != nil {
		return nil, err
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("node addresses: node %s: %w", cfg.NodeName, err)
	}
	return InternalIPs(node), nil
}

// WaitPodCIDRs waits, at most timeout, for this node's Node object to
// have pod CIDRs and returns them (--ipam kubernetes). While waiting it
// logs why every 10 s; it then fails with ErrNoPodCIDRs, naming the node.
func WaitPodCIDRs(ctx context.Context, cfg Config, timeout time.Duration, log *slog.Logger) (v4, v6 netip.Prefix, err error) {
	_, cs, err := cfg.clientset("wait for pod cidrs")
	if err != nil {
		return v4, v6, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var why string
	lastLog := time.Time{}
	for {
		node, gerr := cs.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{})
		switch {
		case gerr == nil:
			v4, v6, err = PodCIDRs(node)
			if err != nil {
				return v4, v6, err
			}
			if v4.IsValid() || v6.IsValid() {
				log.Info("pod CIDRs from the Node object", "node", cfg.NodeName, "ipv4", v4, "ipv6", v6)
				return v4, v6, nil
			}
			why = "spec.podCIDRs is empty (is the controller manager's --allocate-node-cidrs on?)"
		case apierrors.IsNotFound(gerr):
			why = "the Node object does not exist yet"
		default:
			why = gerr.Error()
		}
		if time.Since(lastLog) >= 10*time.Second {
			log.Warn("waiting for this node's pod CIDRs before serving CNI ADDs (--ipam kubernetes)", "node", cfg.NodeName, "reason", why)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return v4, v6, fmt.Errorf("node %s after %s: %s: %w", cfg.NodeName, timeout, why, ErrNoPodCIDRs)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// nodeWatch follows the Node objects: this node's address goes to the
// endpoint status writer and its pod CIDRs are compared with the ones in
// use; the other nodes go to the NodeSink as one full set per change
// burst.
type nodeWatch struct {
	self   string
	nodes  corelisters.NodeLister
	sink   NodeSink // nil: other nodes are only counted
	inUse  []netip.Prefix
	onAddr func(string)
	// onLabels is told this node's labels and audit mode (its
	// AuditAnnotation) whenever its Node changes (the host endpoint's,
	// for host policies).
	onLabels func(map[string]string, bool)
	// onNode is told the name of every other node that changed (added,
	// updated or deleted): its remote claims are checked again.
	onNode func(string)
	log    *slog.Logger
	wake   chan struct{}

	// mu guards the fields below.
	mu sync.Mutex
	// cidrMismatch describes a change of this node's pod CIDRs away from
	// the ones in use ("" while they agree).
	cidrMismatch string
	synced       int // other nodes in the last SyncNodes that succeeded
	syncErr      string
}

func (n *nodeWatch) changed(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		if n.onNode != nil && d.Key != n.self {
			n.onNode(d.Key)
		}
		obj = nil
	}
	node, ok := obj.(*corev1.Node)
	if ok && node.Name == n.self {
		n.selfChanged(node)
		return
	}
	if ok && n.onNode != nil {
		n.onNode(node.Name)
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// selfChanged handles this node's object: the node address for the
// endpoint objects, and a pod CIDR change, which is logged and reported
// (live pods keep their addresses; the agent does not renumber).
func (n *nodeWatch) selfChanged(node *corev1.Node) {
	if n.onLabels != nil {
		n.onLabels(node.Labels, NodePolicyAudit(node))
	}
	if ips := InternalIPs(node); len(ips) > 0 && n.onAddr != nil {
		n.onAddr(ips[0].String())
	}
	if len(n.inUse) == 0 {
		return
	}
	v4, v6, err := PodCIDRs(node)
	var got []netip.Prefix
	for _, p := range []netip.Prefix{v4, v6} {
		if p.IsValid() {
			got = append(got, p)
		}
	}
	msg := ""
	switch {
	case err != nil:
		msg = err.Error()
	case !slices.Equal(got, n.inUse):
		msg = fmt.Sprintf("node spec.podCIDRs are %v, the agent allocates from %v; restart the agent to use them (live pods keep their addresses)", got, n.inUse)
	}
	n.mu.Lock()
	prev := n.cidrMismatch
	n.cidrMismatch = msg
	n.mu.Unlock()
	if msg != "" && msg != prev {
		n.log.Error("this node's pod CIDRs changed while running", "node", n.self, "detail", msg)
	}
}

// run hands the sink the other nodes after each burst of changes.
func (n *nodeWatch) run(ctx context.Context) {
	var backoff time.Duration
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wake:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(nodeCoalesce):
		}
		if err := n.sync(ctx); err != nil {
			backoff = min(max(2*backoff, 100*time.Millisecond), remoteRetryMax)
			n.log.Warn("nodes not handed to the datapath; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			select {
			case n.wake <- struct{}{}:
			default:
			}
			continue
		}
		backoff = 0
	}
}

// others is the set of other nodes as the datapath needs them.
func (n *nodeWatch) others() ([]datapath.RemoteNode, error) {
	all, err := n.nodes.List(k8slabels.Everything())
	if err != nil {
		return nil, err
	}
	out := make([]datapath.RemoteNode, 0, len(all))
	for _, node := range all {
		if node.Name == n.self {
			continue
		}
		rn := datapath.RemoteNode{Name: node.Name, Addrs: InternalIPs(node), Labels: maps.Clone(node.Labels)}
		var bad []string
		if rn.HealthIPs, bad = HealthIPs(node); len(bad) > 0 {
			n.log.Warn("node's health endpoint annotation is no address of its family; ignored", "node", node.Name, "annotations", bad)
		}
		v4, v6, err := PodCIDRs(node)
		if err != nil {
			n.log.Warn("node with a bad pod CIDR; its pods are not routed", "node", node.Name, "err", err)
		}
		for _, p := range []netip.Prefix{v4, v6} {
			if p.IsValid() {
				rn.PodCIDRs = append(rn.PodCIDRs, p)
			}
		}
		out = append(out, rn)
	}
	slices.SortFunc(out, func(a, b datapath.RemoteNode) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (n *nodeWatch) sync(ctx context.Context) error {
	nodes, err := n.others()
	if err != nil {
		return err
	}
	if n.sink != nil {
		ctx, cancel := context.WithTimeout(ctx, applyTimeout)
		defer cancel()
		if err := n.sink.SyncNodes(ctx, NodeSource, nodes); err != nil {
			n.mu.Lock()
			n.syncErr = err.Error()
			n.mu.Unlock()
			return fmt.Errorf("sync nodes: %w", err)
		}
	}
	n.mu.Lock()
	n.synced, n.syncErr = len(nodes), ""
	n.mu.Unlock()
	return nil
}
