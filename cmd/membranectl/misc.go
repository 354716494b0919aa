package main

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func (a *app) statusCommand() *cobra.Command {
	var allNodes bool
	var k kubeFlags
	cmd := &cobra.Command{
		Use: "status", Short: "Agent status (exit 5 while starting or stopping); --all-nodes: every node's agent through the API server", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			if allNodes {
				return a.allNodesStatus(ctx, &k)
			}
			st, err := a.c.Status(ctx)
			if st == nil || st.State == "" {
				return err
			}
			if perr := a.statusOut(st); perr != nil {
				return perr
			}
			if err != nil {
				return exitCodeError{fmt.Errorf("agent is %s", st.State), exitNotReady}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&allNodes, "all-nodes", false, "every node's agent, through the API server (pods/exec into the DaemonSet's pods)")
	k.register(cmd)
	return cmd
}

func (a *app) statusOut(st *models.Status) error {
	if a.output != "table" {
		return a.print(st)
	}
	t := &table{tw: tabwriter.NewWriter(a.out, 0, 4, 1, ' ', 0)}
	t.row("State:", st.State+msgSuffix(st.Message))
	if st.Version != "" {
		t.row("Version:", st.Version)
	}
	t.row("Datapath:", st.Datapath)
	t.row("Endpoints:", fmt.Sprintf("%d (%d ready)", st.Endpoints, st.Ready))
	t.row("Identities:", st.Identities)
	if st.IPAM != nil {
		for _, p := range []struct {
			name string
			fam  *models.IPAMFamilyStatus
		}{{"IPv4", st.IPAM.IPv4}, {"IPv6", st.IPAM.IPv6}} {
			if p.fam != nil {
				t.row(p.name+":", fmt.Sprintf("%s, %d used, %d free", p.fam.Cidr, p.fam.Used, p.fam.Free))
			}
		}
	}
	if st.Health != nil {
		t.row("Health:", healthText(st.Health))
	}
	if st.K8s != nil {
		t.row("Kubernetes:", k8sText(st.K8s))
	}
	if st.Kvstore != nil {
		t.row("Kvstore:", kvstoreText(st.Kvstore))
	}
	if st.ClusterIdentity != nil {
		t.row("Cluster identities:", clusterIdentityText(st.ClusterIdentity))
	}
	if st.Flows != nil {
		t.row("Flows:", flowsText(st.Flows))
	}
	if sd := st.StateDir; sd != nil {
		t.row("State dir:", stateDirText(sd))
	}
	if bp := st.BPFPins; bp != nil && bp.Repairs > 0 {
		t.row("BPF pins:", fmt.Sprintf("%d repairs (%d pinned again), last %s: %s", bp.Repairs, bp.Repinned,
			bp.LastRepair.UTC().Format(time.RFC3339), bp.LastMessage))
	}
	t.row("Started:", st.Started.UTC().Format(time.RFC3339))
	return t.flush()
}

// stateDirText is the state directory's line: its path and health (the
// cause and the error while it takes no writes).
func stateDirText(sd *models.StateDirStatus) string {
	if sd.Healthy {
		return sd.Path + ", healthy"
	}
	return fmt.Sprintf("%s, UNHEALTHY (%s) since %s, creates refused: %s", sd.Path, sd.Cause, sd.Since.UTC().Format(time.RFC3339), sd.LastError)
}

// healthText is the health endpoint's line: state, then its addresses
// (both families on a dual-stack node) and endpoint, then the error.
func healthText(h *models.HealthStatus) string {
	out := h.State
	var addrs []string
	for _, ip := range []string{h.IP, h.IPv6} {
		if ip != "" {
			addrs = append(addrs, ip)
		}
	}
	if len(addrs) > 0 {
		out += fmt.Sprintf(" (%s, endpoint %d)", strings.Join(addrs, " "), h.Endpoint)
	}
	if h.Error != "" {
		out += ": " + h.Error
	}
	if h.NodesProbed > 0 {
		out += fmt.Sprintf("; %d remote nodes probed", h.NodesProbed)
		if len(h.FailingNodes) > 0 {
			out += ", failing: " + strings.Join(h.FailingNodes, " ")
		}
	}
	return out
}

func (a *app) healthCommand() *cobra.Command {
	return &cobra.Command{
		Use: "health", Short: "The health endpoint and every remote node's reachability (ICMP and HTTP probes)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			h, err := a.c.Health(ctx)
			if err != nil {
				return err
			}
			if a.output != "table" {
				return a.print(h)
			}
			t := &table{tw: tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)}
			if h.Local != nil {
				t.row("Local:", healthText(h.Local))
			}
			t.row("NODE", "STATE", "ADDRESS", "ICMP", "HTTP", "HEALTH-ENDPOINT", "ICMP", "HTTP", "SINCE")
			for _, n := range h.Nodes {
				for i := range max(len(n.Addresses), len(n.HealthEndpoint)) {
					name, state, since := n.Name, n.State, n.Since.UTC().Format(time.RFC3339)
					if i > 0 {
						name, state, since = "", "", ""
					}
					row := []any{name, state}
					for _, set := range [][]models.NodeAddrHealth{n.Addresses, n.HealthEndpoint} {
						if i < len(set) {
							row = append(row, set[i].IP, probeText(set[i].ICMP), probeText(set[i].HTTP))
						} else {
							row = append(row, "-", "-", "-")
						}
					}
					t.row(append(row, since)...)
				}
			}
			return t.flush()
		},
	}
}

// probeText is one probe's cell: its round trip, or why it failed.
func probeText(p models.ProbeResult) string {
	if p.OK {
		return fmt.Sprintf("%.2fms", p.LatencyMS)
	}
	return "failed: " + p.Error
}

// k8sText is the Kubernetes connection's line: state, node and server,
// the connection (with the last error while disconnected), the caches not
// synced yet, then the cached counts.
func k8sText(k *models.K8sStatus) string {
	out := fmt.Sprintf("%s (node %s, %s)", k.State, k.Node, k.Server)
	if k.Connection != "" {
		out += ", " + k.Connection
		if k.Connection == "disconnected" && k.LastError != "" {
			out += fmt.Sprintf(" (%s", k.LastError)
			if k.LastErrorAt != nil {
				out += " at " + k.LastErrorAt.UTC().Format(time.RFC3339)
			}
			out += ")"
		}
	}
	var pending []string
	for _, name := range slices.Sorted(maps.Keys(k.Synced)) {
		if !k.Synced[name] {
			pending = append(pending, name)
		}
	}
	if len(pending) > 0 {
		out += ", not synced: " + strings.Join(pending, " ")
	}
	out += fmt.Sprintf(", %d pods, %d namespaces, %d networkpolicies", k.Pods, k.Namespaces, k.Policies)
	if k.MembranePolicies > 0 {
		out += fmt.Sprintf(", %d membrane policies", k.MembranePolicies)
	}
	if k.PolicyErrors > 0 {
		out += fmt.Sprintf(", %d refused", k.PolicyErrors)
	}
	if k.PoliciesPartial > 0 {
		out += fmt.Sprintf(", %d partially refused", k.PoliciesPartial)
	}
	if k.Queue > 0 {
		out += fmt.Sprintf(", %d queued", k.Queue)
	}
	if k.RemoteEndpointsSynced {
		out += fmt.Sprintf(", %d remote endpoints", k.RemoteEndpoints)
	}
	if k.PodCIDRWarning != "" {
		out += ", pod CIDRs changed (" + k.PodCIDRWarning + ")"
	}
	return out
}

// kvstoreText is the kvstore connection's line: health, node and
// endpoints, then what is published and mirrored, then the last error.
func kvstoreText(k *models.KvstoreStatus) string {
	state := "healthy"
	if !k.Healthy {
		state = "unreachable"
	}
	out := fmt.Sprintf("%s %s (node %s, %s)", k.Backend, state, k.Node, strings.Join(k.Endpoints, ","))
	if !k.Synced {
		out += ", not synced"
	}
	out += fmt.Sprintf(", %d published, %d remote endpoints, %d remote nodes", k.Published, k.RemoteEndpoints, k.RemoteNodes)
	if k.LeaseRegrants > 0 {
		out += fmt.Sprintf(", lease lost %d times", k.LeaseRegrants)
	}
	if k.LeaseKept > 0 {
		out += fmt.Sprintf(", keep-alive late and lease kept %d times", k.LeaseKept)
	}
	if k.LastError != "" {
		out += ": " + k.LastError
	}
	return out
}

func msgSuffix(m string) string {
	if m == "" {
		return ""
	}
	return " (" + m + ")"
}

func (a *app) identityCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "identity", Aliases: []string{"identities", "id"}, Short: "Security identities"}
	list := &cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List identities with reference counts", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			ids, err := a.c.Identities(ctx)
			if err != nil || a.output != "table" {
				return a.printOr(ids, err)
			}
			t := newTable(a.out, "ID", "REFS", "LABELS")
			for _, id := range ids {
				refs := strconv.Itoa(id.RefCount)
				if id.Reserved {
					refs = "reserved"
				}
				t.row(id.ID, refs, strings.Join(id.Labels, ","))
			}
			return t.flush()
		},
	}
	cmd.AddCommand(list, &cobra.Command{
		Use: "get ID", Short: "Show one identity", Args: exactArgs(1, "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return usageError{fmt.Errorf("identity get: %q is not a number", args[0])}
			}
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			id, err := a.c.Identity(ctx, n)
			return a.printOr(id, err)
		},
	})
	return group(cmd, list.RunE)
}

func (a *app) ipamCommand() *cobra.Command {
	list := func(cmd *cobra.Command, _ []string) error {
		ctx, cancel := a.ctx(cmd)
		defer cancel()
		st, err := a.c.IPAMStatus(ctx)
		if err != nil || a.output != "table" {
			return a.printOr(st, err)
		}
		t := newTable(a.out, "IP", "FAMILY", "OWNER", "ENDPOINT")
		var pools []string
		for _, p := range []struct {
			name string
			fam  *models.IPAMFamilyStatus
		}{{"ipv4", st.IPv4}, {"ipv6", st.IPv6}} {
			if p.fam == nil {
				continue
			}
			pools = append(pools, fmt.Sprintf("%s %s: %d used, %d free", p.name, p.fam.Cidr, p.fam.Used, p.fam.Free))
			for _, al := range p.fam.Allocations {
				ep := ""
				if al.Endpoint != 0 {
					ep = strconv.FormatInt(al.Endpoint, 10)
				}
				t.row(al.IP, p.name, al.Owner, ep)
			}
		}
		if err := t.flush(); err != nil {
			return err
		}
		for _, p := range pools {
			fmt.Fprintln(a.out, p)
		}
		return nil
	}
	cmd := group(&cobra.Command{Use: "ipam", Short: "Address pools and allocations"}, list)
	cmd.AddCommand(&cobra.Command{Use: "list", Aliases: []string{"ls", "status"}, Short: "Allocations and pool usage", Args: noArgs, RunE: list})
	var fam, owner string
	alloc := &cobra.Command{
		Use: "allocate", Short: "Allocate addresses (both families unless --family)", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			r, err := a.c.IPAMAllocate(ctx, fam, owner)
			return a.printOr(r, err)
		},
	}
	alloc.Flags().StringVar(&fam, "family", "", "ipv4 or ipv6")
	alloc.Flags().StringVar(&owner, "owner", "", "owner, e.g. namespace/pod")
	cmd.AddCommand(alloc, &cobra.Command{
		Use: "release IP", Short: "Release an address (refused while an endpoint uses it)", Args: exactArgs(1, "IP"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			return a.c.IPAMRelease(ctx, args[0])
		},
	})
	return cmd
}

func (a *app) ipcacheCommand() *cobra.Command {
	cmd := group(&cobra.Command{Use: "ipcache", Short: "The IP to identity cache"}, nil)
	cmd.AddCommand(&cobra.Command{
		Use: "list", Aliases: []string{"ls"}, Short: "List IP to identity mappings", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			entries, err := a.c.IPCache(ctx)
			if err != nil || a.output != "table" {
				return a.printOr(entries, err)
			}
			t := newTable(a.out, "CIDR", "IDENTITY", "SOURCE")
			for _, e := range entries {
				t.row(e.CIDR, e.Identity, e.Source)
			}
			return t.flush()
		},
	})
	return cmd
}

func (a *app) dropsCommand() *cobra.Command {
	return &cobra.Command{
		Use: "drops", Short: "Show the datapath's drop counters per endpoint, reason and direction", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := a.ctx(cmd)
			defer cancel()
			drops, err := a.c.Drops(ctx)
			if err != nil || a.output != "table" {
				return a.printOr(drops, err)
			}
			t := newTable(a.out, "ENDPOINT", "REASON", "DIRECTION", "PACKETS", "BYTES")
			for _, d := range drops {
				t.row(d.Endpoint, d.Reason, d.Direction, d.Packets, d.Bytes)
			}
			return t.flush()
		},
	}
}

// clusterIdentityText is the cluster identity store's line: backend and
// health, sync, counts, the label sets waiting and the last error.
func clusterIdentityText(c *models.ClusterIdentityStatus) string {
	health := "healthy"
	if !c.Healthy {
		health = "unreachable since " + c.Since.UTC().Format(time.RFC3339)
	}
	sync := "synced"
	if !c.Synced {
		sync = "not synced"
	}
	out := fmt.Sprintf("%s, %s, %s, %d known, %d in use", c.Backend, health, sync, c.Known, c.InUse)
	if c.Waiting > 0 {
		out += fmt.Sprintf(", %d waiting (%s)", c.Waiting, strings.Join(c.WaitingLabels, " "))
	}
	if c.LastError != "" {
		out += ": " + c.LastError
	}
	return out
}
