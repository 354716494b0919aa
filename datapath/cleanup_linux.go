package datapath

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/membrane-cni/membrane/pkg/domain/ifname"
)

// Cleanup removes what the Linux datapath made in the calling thread's
// network namespace and in the bpffs: the endpoints' host veths (their
// pods lose their network: run it once the pods are gone or when the
// node is drained), the gateway, tunnel and health devices, the cls_bpf
// filters on other devices (uplinks), the routes to other nodes, the L7
// and DNS proxies' rule and routing table, the masquerade table and
// every pin (which detaches the TCX and socket links). What it leaves:
// the forwarding sysctls (other software on a node relies on them). It
// is idempotent: a node without any of it is a success.
func Cleanup(_ context.Context, cfg CleanupConfig, log *slog.Logger) (CleanupReport, error) {
	if cfg.GatewayDevice == "" {
		cfg.GatewayDevice = DefaultGatewayDevice
	}
	if cfg.TunnelDevice == "" {
		cfg.TunnelDevice = DefaultTunnelDevice
	}
	if cfg.BPFFS == "" {
		cfg.BPFFS = DefaultBPFFS
	}
	var rep CleanupReport
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return rep, fmt.Errorf("cleanup: netlink: %w", err)
	}
	defer nl.Close()
	var errs []error
	links, err := nl.LinkList()
	if err != nil {
		return rep, fmt.Errorf("cleanup: list links: %w", err)
	}
	for _, lk := range links {
		name := lk.Attrs().Name
		ours := name == cfg.GatewayDevice || name == cfg.TunnelDevice ||
			(cfg.HealthIfName != "" && name == cfg.HealthIfName) ||
			(lk.Type() == "veth" && (ifname.Managed(name) || ifname.IsTombstone(name)))
		if ours {
			if err := nl.LinkDel(lk); err != nil && !isLinkNotFound(err) {
				errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
				continue
			}
			rep.Links++
			log.Info("device removed", "device", name)
			continue
		}
		n, err := removeFilters(nl, lk)
		rep.Filters += n
		if err != nil {
			errs = append(errs, err)
		}
	}
	n, err := removeRoutes(nl)
	rep.Routes += n
	errs = append(errs, err)
	n, err = removeRules(nl)
	rep.Rules += n
	errs = append(errs, err)
	n, err = removeMasqTable()
	rep.NFTables += n
	errs = append(errs, err)
	if cfg.HealthNetns != "" {
		if _, err := os.Stat(cfg.HealthNetns); err == nil {
			if err := removeNetns(cfg.HealthNetns); err != nil {
				errs = append(errs, fmt.Errorf("remove health netns %s: %w", cfg.HealthNetns, err))
			}
		}
	}
	n, err = removePins(cfg.BPFFS)
	rep.Pins += n
	errs = append(errs, err)
	return rep, errors.Join(errs...)
}

// removeFilters deletes the datapath's cls_bpf filters (named
// "membrane-...") on lk, and the clsact qdisc when nothing else is
// attached to it any more.
func removeFilters(nl *netlink.Handle, lk netlink.Link) (int, error) {
	removed := 0
	left := 0
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := nl.FilterList(lk, parent)
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no clsact
			}
			return removed, fmt.Errorf("list tc filters of %s: %w", lk.Attrs().Name, err)
		}
		for _, f := range fs {
			bf, ok := f.(*netlink.BpfFilter)
			if !ok || !strings.HasPrefix(bf.Name, "membrane-") {
				left++
				continue
			}
			if err := nl.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) {
				return removed, fmt.Errorf("delete tc filter %s of %s: %w", bf.Name, lk.Attrs().Name, err)
			}
			removed++
		}
	}
	if removed > 0 && left == 0 {
		qdisc := &netlink.GenericQdisc{
			QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lk.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
			QdiscType:  "clsact",
		}
		if err := nl.QdiscDel(qdisc); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			return removed, fmt.Errorf("delete clsact of %s: %w", lk.Attrs().Name, err)
		}
	}
	return removed, nil
}

// removeRoutes deletes the routes to other nodes (protocol
// nodeRouteProto) and the proxies' routing table.
func removeRoutes(nl *netlink.Handle) (int, error) {
	n := 0
	for _, filter := range []struct {
		route netlink.Route
		mask  uint64
	}{
		{netlink.Route{Protocol: nodeRouteProto, Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_PROTOCOL | netlink.RT_FILTER_TABLE},
		{netlink.Route{Table: proxyRouteTable}, netlink.RT_FILTER_TABLE},
	} {
		rs, err := nl.RouteListFiltered(netlink.FAMILY_ALL, &filter.route, filter.mask)
		if err != nil {
			return n, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range rs {
			if err := nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return n, fmt.Errorf("delete route %s: %w", r.Dst, err)
			}
			n++
		}
	}
	return n, nil
}

// removeRules deletes the policy routing rules that send marked traffic
// to the proxies' table.
func removeRules(nl *netlink.Handle) (int, error) {
	n := 0
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rules, err := nl.RuleList(fam)
		if err != nil {
			return n, fmt.Errorf("list rules: %w", err)
		}
		for _, r := range rules {
			if r.Table != proxyRouteTable {
				continue
			}
			if err := nl.RuleDel(&r); err != nil && !errors.Is(err, unix.ENOENT) {
				return n, fmt.Errorf("delete rule to table %d: %w", r.Table, err)
			}
			n++
		}
	}
	return n, nil
}

// removeMasqTable deletes the masquerade nftables table.
func removeMasqTable() (int, error) {
	c, err := nftables.New()
	if err != nil {
		return 0, fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return 0, fmt.Errorf("nftables: list tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == masqTable {
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				return 0, fmt.Errorf("nftables: delete table %s: %w", masqTable, err)
			}
			return 1, nil
		}
	}
	return 0, nil
}

// removePins removes the agent's bpffs directory: every pinned map,
// program and link (unpinning a link the agent no longer holds detaches
// it). A directory that is a bpffs mount of its own keeps its mount and
// the kernel's preloaded iterators (maps.debug, progs.debug).
func removePins(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("remove pins under %s: %w", dir, err)
	}
	n := 0
	for _, e := range entries {
		if e.Name() == "maps.debug" || e.Name() == "progs.debug" {
			continue
		}
		p := filepath.Join(dir, e.Name())
		_ = filepath.WalkDir(p, func(string, os.DirEntry, error) error { n++; return nil })
		if err := os.RemoveAll(p); err != nil {
			return n, fmt.Errorf("remove pins under %s: %w", dir, err)
		}
	}
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) == nil && unix.Stat(filepath.Dir(dir), &parent) == nil && st.Dev == parent.Dev {
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return n, fmt.Errorf("remove %s: %w", dir, err)
		}
	}
	return n, nil
}
