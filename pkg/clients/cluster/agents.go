package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// Agents says where the DaemonSet's agent pods are.
type Agents struct {
	Namespace string // the chart's release namespace, membrane-system by default
	Selector  string // app.kubernetes.io/name=membrane-agent
	Container string // agent
	// Ctl is membranectl's path in the agent image and Socket the
	// agent's socket as the container sees it.
	Ctl    string
	Socket string
	// Parallel bounds the exec streams open at once.
	Parallel int
}

// DefaultAgents is the chart's layout.
func DefaultAgents() Agents {
	return Agents{Namespace: "membrane-system", Selector: "app.kubernetes.io/name=membrane-agent", Container: "agent",
		Ctl: "/usr/local/bin/membranectl", Socket: "/var/run/membrane/membrane.sock", Parallel: 16}
}

// AgentPod is one node's agent pod.
type AgentPod struct {
	Node, Name string
	Ready      bool
}

// AgentPods lists the agent pods, one per node (not those being
// deleted), sorted by node.
func (c *Client) AgentPods(ctx context.Context, a Agents) ([]AgentPod, error) {
	pods, err := c.Kube.CoreV1().Pods(a.Namespace).List(ctx, metav1.ListOptions{LabelSelector: a.Selector})
	if err != nil {
		return nil, fmt.Errorf("list agent pods in %s (%s): %w", a.Namespace, a.Selector, err)
	}
	var out []AgentPod
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" {
			continue
		}
		out = append(out, AgentPod{Node: p.Spec.NodeName, Name: p.Name, Ready: podReady(&p)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no agent pods in %s match %s", a.Namespace, a.Selector)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Ctl runs membranectl with args (and -o json) in one agent pod and
// decodes its answer into out. membranectl exits 5 while the agent
// starts or stops but still prints the status: a decodable answer wins
// over the exit code.
func (c *Client) Ctl(ctx context.Context, a Agents, pod string, out any, args ...string) error {
	cmd := append([]string{a.Ctl, "--socket", a.Socket, "-o", "json"}, args...)
	stdout, err := c.Exec(ctx, a.Namespace, pod, a.Container, cmd)
	if len(stdout) > 0 {
		if derr := json.Unmarshal(stdout, out); derr == nil {
			return err
		} else if err == nil {
			return fmt.Errorf("%s: decode %q answer: %w", pod, args, derr)
		}
	}
	return err
}

// NodeStatus is one agent's state as `status --all-nodes` shows it.
type NodeStatus struct {
	Node  string `json:"node"`
	Pod   string `json:"pod"`
	Ready bool   `json:"pod-ready"`
	// Error is why the agent could not be read (exec refused, agent
	// unreachable); the other fields are then what could be read.
	Error          string               `json:"error,omitempty"`
	Status         *models.Status       `json:"status,omitempty"`
	PolicyRevision uint64               `json:"policy-revision"`
	Drops          uint64               `json:"drops"`
	DropReasons    map[string]uint64    `json:"drop-reasons,omitempty"`
	Health         *models.HealthReport `json:"health,omitempty"`
}

// Statuses reads every agent's status, policy revision, drop counters
// and health matrix, at most a.Parallel nodes at once. One node that
// cannot be read is reported with its error; the others still are.
func (c *Client) Statuses(ctx context.Context, a Agents) ([]NodeStatus, error) {
	pods, err := c.AgentPods(ctx, a)
	if err != nil {
		return nil, err
	}
	out := make([]NodeStatus, len(pods))
	par := max(a.Parallel, 1)
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			out[i] = c.nodeStatus(ctx, a, p)
		}()
	}
	wg.Wait()
	return out, nil
}

func (c *Client) nodeStatus(ctx context.Context, a Agents, p AgentPod) NodeStatus {
	ns := NodeStatus{Node: p.Node, Pod: p.Name, Ready: p.Ready}
	var errs []string
	var st models.Status
	if err := c.Ctl(ctx, a, p.Name, &st, "status"); st.State != "" {
		ns.Status = &st
	} else if err != nil {
		errs = append(errs, err.Error())
	}
	var pl models.PolicyList
	if err := c.Ctl(ctx, a, p.Name, &pl, "policy", "get"); err != nil {
		errs = append(errs, err.Error())
	}
	ns.PolicyRevision = pl.Revision
	var drops []models.DropCounter
	if err := c.Ctl(ctx, a, p.Name, &drops, "drops"); err != nil {
		errs = append(errs, err.Error())
	}
	for _, d := range drops {
		ns.Drops += d.Packets
		if ns.DropReasons == nil {
			ns.DropReasons = map[string]uint64{}
		}
		ns.DropReasons[d.Reason] += d.Packets
	}
	var h models.HealthReport
	if err := c.Ctl(ctx, a, p.Name, &h, "health"); err != nil {
		errs = append(errs, err.Error())
	} else {
		ns.Health = &h
	}
	if len(errs) > 0 {
		ns.Error = errs[0]
		if len(errs) > 1 {
			ns.Error += fmt.Sprintf(" (and %d more)", len(errs)-1)
		}
	}
	return ns
}
