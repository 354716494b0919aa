package main

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/membrane-cni/membrane/pkg/clients/cluster"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// kubeFlags are the flags of the commands that go through the API
// server instead of one agent's socket.
type kubeFlags struct {
	kubeconfig, context string
	agents              cluster.Agents
}

func (k *kubeFlags) register(cmd *cobra.Command) {
	k.agents = cluster.DefaultAgents()
	f := cmd.Flags()
	f.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&k.context, "context", "", "kubeconfig context")
	f.StringVar(&k.agents.Namespace, "agent-namespace", k.agents.Namespace, "namespace of the membrane-agent DaemonSet")
}

// client builds the API server client from the kubeconfig rules
// kubectl follows.
func (k *kubeFlags) client() (*cluster.Client, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules,
		&clientcmd.ConfigOverrides{CurrentContext: k.context}).ClientConfig()
	if err != nil {
		return nil, usageError{fmt.Errorf("kubeconfig: %w", err)}
	}
	cfg.UserAgent = "membranectl"
	return cluster.NewClient(cfg)
}

// allNodesStatus is status --all-nodes: every agent through the API
// server, one row per node.
func (a *app) allNodesStatus(ctx context.Context, k *kubeFlags) error {
	c, err := k.client()
	if err != nil {
		return err
	}
	nodes, err := c.Statuses(ctx, k.agents)
	if err != nil {
		return err
	}
	if a.output != "table" {
		if err := a.print(nodes); err != nil {
			return err
		}
	} else if err := a.allNodesTable(nodes); err != nil {
		return err
	}
	var bad []string
	notReady := false
	for _, n := range nodes {
		switch {
		case n.Error != "" && n.Status == nil:
			bad = append(bad, n.Node+": "+n.Error)
		case n.Status != nil && n.Status.State != "ok":
			notReady = true
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d agents could not be read: %s", len(bad), len(nodes), strings.Join(bad, "; "))
	}
	if notReady {
		return exitCodeError{fmt.Errorf("not every agent is ok (starting, stopping or degraded)"), exitNotReady}
	}
	return nil
}

func (a *app) allNodesTable(nodes []cluster.NodeStatus) error {
	t := &table{tw: tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)}
	t.row("NODE", "STATE", "ENDPOINTS", "IDENTITIES", "POLICY-REV", "DROPS", "CONTROL-PLANE", "HEALTH")
	for _, n := range nodes {
		if n.Status == nil {
			t.row(n.Node, "unknown", "-", "-", "-", "-", "-", "error: "+n.Error)
			continue
		}
		st := n.Status
		state := st.State
		if !n.Ready {
			state += " (pod not ready)"
		}
		cp := "-"
		switch {
		case st.K8s != nil:
			cp = "k8s " + st.K8s.Connection
		case st.Kvstore != nil:
			cp = "etcd unreachable"
			if st.Kvstore.Healthy {
				cp = "etcd healthy"
			}
		}
		health := "-"
		if h := n.Health; h != nil {
			ok := 0
			var failing []string
			for _, nh := range h.Nodes {
				if nh.State == "ok" {
					ok++
				} else {
					failing = append(failing, nh.Name+" "+nh.State)
				}
			}
			health = fmt.Sprintf("%d/%d nodes ok", ok, len(h.Nodes))
			if h.Local != nil {
				health = "local " + h.Local.State + ", " + health
			}
			if len(failing) > 0 {
				health += " (" + strings.Join(failing, ", ") + ")"
			}
		}
		drops := fmt.Sprint(n.Drops)
		if len(n.DropReasons) > 0 {
			var parts []string
			for _, r := range slices.Sorted(maps.Keys(n.DropReasons)) {
				parts = append(parts, fmt.Sprintf("%s %d", r, n.DropReasons[r]))
			}
			drops += " (" + strings.Join(parts, ", ") + ")"
		}
		if n.Error != "" {
			health += "; error: " + n.Error
		}
		t.row(n.Node, state, fmt.Sprintf("%d (%d ready)", st.Endpoints, st.Ready), st.Identities, n.PolicyRevision, drops, cp, health)
	}
	return t.flush()
}

func (a *app) connectivityCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "connectivity", Short: "Check a live cluster end to end"}, nil)
	var k kubeFlags
	o := cluster.DefaultConnectivityOptions()
	var pull string
	test := &cobra.Command{
		Use:   "test",
		Short: "Deploy test pods into a namespace, check pod, Service, host, outside, DNS, NetworkPolicy and L7 paths, then remove them",
		Long: "connectivity test creates its own namespace (--namespace), pods of upstream's agnhost image on up to two\n" +
			"nodes, a Service and, in turn, a NetworkPolicy and an L7 MembraneNetworkPolicy, runs each check from a\n" +
			"client pod (kubectl exec through the API server) and deletes the namespace. Exit 1 when a check fails.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.PullPolicy = corev1.PullPolicy(pull)
			o.Agents = k.agents
			if err := o.Validate(); err != nil {
				return usageError{err}
			}
			c, err := k.client()
			if err != nil {
				return err
			}
			// Ctrl-C stops the checks; cleanup still runs.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if a.output == "table" {
				o.Log = func(format string, args ...any) {
					fmt.Fprintf(a.errOut, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
				}
			}
			rep, err := c.RunConnectivity(ctx, o)
			if rep != nil {
				if perr := a.connectivityOut(rep); perr != nil {
					return perr
				}
			}
			if err != nil {
				return err
			}
			if !rep.OK() {
				return fmt.Errorf("connectivity test: %d failed, %d passed, %d skipped%s", rep.Failed, rep.Passed, rep.Skipped, cleanupSuffix(rep))
			}
			return nil
		},
	}
	k.register(test)
	f := test.Flags()
	f.StringVar(&o.Namespace, "namespace", o.Namespace, "namespace the test creates and deletes")
	f.StringVar(&o.Image, "image", o.Image, "image of the test pods (agnhost: netexec, connect, curl)")
	f.StringVar(&pull, "image-pull-policy", string(o.PullPolicy), "Always, IfNotPresent or Never")
	f.StringVar(&o.External, "external-target", "", "host:port outside the cluster the pods should reach (empty: skip pod-to-world)")
	f.DurationVar(&o.CheckTimeout, "check-timeout", o.CheckTimeout, "how long one check retries")
	f.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "how long the pods may take to start (and the namespace to go)")
	f.BoolVar(&o.Keep, "keep", false, "leave the namespace for inspection")
	cmd.AddCommand(test)
	return cmd
}

func cleanupSuffix(r *cluster.ConnectivityReport) string {
	if r.Cleanup == "" {
		return ""
	}
	return "; cleanup: " + r.Cleanup
}

func (a *app) connectivityOut(r *cluster.ConnectivityReport) error {
	if a.output != "table" {
		return a.print(r)
	}
	t := &table{tw: tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)}
	t.row("CHECK", "RESULT", "TOOK", "DETAIL")
	for _, c := range r.Checks {
		t.row(c.Name, c.Result, c.Took.Round(time.Millisecond), c.Detail)
	}
	if err := t.flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(a.out, "\n%d passed, %d failed, %d skipped on %s (namespace %s)%s\n",
		r.Passed, r.Failed, r.Skipped, strings.Join(r.Nodes, ", "), r.Namespace, cleanupSuffix(r))
	return err
}

// observeAllNodes is observe --all-nodes: each agent's own membranectl
// observe (the same filters, as query parameters turned back into
// flags), merged by time, or interleaved as they come with -f.
func (a *app) observeAllNodes(cmd *cobra.Command, k *kubeFlags, q url.Values, follow bool) error {
	c, err := k.client()
	if err != nil {
		return err
	}
	var args []string
	for _, key := range slices.Sorted(maps.Keys(q)) {
		for _, v := range q[key] {
			args = append(args, "--"+key+"="+v)
		}
	}
	if follow {
		args = append(args, "--follow")
	}
	ctx, cancel := context.WithCancel(cmd.Context())
	if !follow || cmd.Flags().Changed("timeout") {
		ctx, cancel = a.ctx(cmd)
	}
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	var perr error
	nodeErrs, err := c.Observe(ctx, k.agents, args, follow, func(f models.Flow) {
		if perr == nil {
			perr = a.printFlow(f)
		}
	})
	if err != nil {
		return err
	}
	if perr != nil {
		return perr
	}
	for _, e := range nodeErrs {
		fmt.Fprintf(a.errOut, "membranectl: %v\n", e)
	}
	if len(nodeErrs) > 0 {
		return fmt.Errorf("%d nodes could not be read", len(nodeErrs))
	}
	return nil
}
