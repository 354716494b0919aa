package nodesnap

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Node says how to reach a node.
type Node struct {
	// Exec runs a program in the node's network namespace and returns its
	// combined output.
	Exec func(name string, args ...string) (string, error)
	// Do runs fn on an OS thread in the node's network namespace.
	Do func(fn func() error) error
	// Root prefixes the node's paths as this process sees them: "" for
	// this process's mount namespace, /proc/<pid>/root for another's.
	Root string
	// Dirs are the node's directories (its own paths) listed with
	// everything below them; a missing one lists nothing.
	Dirs []string
	// Cgroups are cgroup2 directories (this process's paths) whose
	// directly attached BPF programs are listed.
	Cgroups []string
}

// Take returns the node's state, one line per fact, sorted.
func Take(n Node) ([]string, error) {
	var lines []string
	add := func(what, name string, args ...string) error {
		out, err := n.Exec(name, args...)
		if err != nil {
			return fmt.Errorf("%s: %s %s: %w\n%s", what, name, strings.Join(args, " "), err, out)
		}
		for _, l := range strings.Split(out, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				lines = append(lines, what+": "+l)
			}
		}
		return nil
	}
	for _, c := range []struct {
		what string
		args []string
	}{
		{"link", []string{"-o", "link", "show"}},
		{"addr", []string{"-o", "addr", "show"}},
		{"route4", []string{"-4", "route", "show", "table", "all"}},
		{"route6", []string{"-6", "route", "show", "table", "all"}},
		{"rule4", []string{"-4", "rule", "show"}},
		{"rule6", []string{"-6", "rule", "show"}},
		{"neigh", []string{"neigh", "show", "nud", "permanent"}},
	} {
		if err := add(c.what, "ip", c.args...); err != nil {
			return nil, err
		}
	}
	if err := add("qdisc", "tc", "qdisc", "show"); err != nil {
		return nil, err
	}
	// Legacy iptables, where the tools exist (iptables-nft's tables are
	// nftables tables, listed below).
	for _, save := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		if out, err := n.Exec(save); err == nil {
			for _, l := range strings.Split(out, "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
					lines = append(lines, save+": "+stripCounters(l))
				}
			}
		}
	}
	var devs []string
	err := n.Do(func() error {
		more, ds, err := kernelState()
		lines, devs = append(lines, more...), ds
		return err
	})
	if err != nil {
		return nil, err
	}
	for _, dev := range devs {
		for _, dir := range []string{"ingress", "egress"} {
			// No clsact: an error, and nothing to list.
			out, err := n.Exec("tc", "filter", "show", "dev", dev, dir)
			if err != nil {
				continue
			}
			for _, l := range strings.Split(out, "\n") {
				if l = strings.TrimSpace(l); l != "" {
					lines = append(lines, fmt.Sprintf("filter %s %s: %s", dev, dir, l))
				}
			}
		}
	}
	for _, cg := range n.Cgroups {
		more, err := cgroupPrograms(cg)
		if err != nil {
			return nil, err
		}
		lines = append(lines, more...)
	}
	for _, d := range n.Dirs {
		lines = append(lines, files(n.Root, d)...)
	}
	slices.Sort(lines)
	return lines, nil
}

// Diff lists the lines only in before ("- ") and only in after ("+ ").
func Diff(before, after []string) []string {
	var out []string
	for _, l := range before {
		if !slices.Contains(after, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range after {
		if !slices.Contains(before, l) {
			out = append(out, "+ "+l)
		}
	}
	return out
}

// stripCounters drops iptables-save's packet and byte counters.
func stripCounters(l string) string {
	if i := strings.Index(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
		return l[:i]
	}
	return l
}

// kernelState lists, in the calling thread's network namespace, the
// nftables tables and chains (with their rule counts) and the TCX
// programs of every device; it returns the devices' names too.
func kernelState() ([]string, []string, error) {
	var lines []string
	c, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: %w", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: list tables: %w", err)
	}
	for _, tb := range tables {
		lines = append(lines, fmt.Sprintf("nft: table %s %s", family(tb.Family), tb.Name))
	}
	chains, err := c.ListChains()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: list chains: %w", err)
	}
	for _, ch := range chains {
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return nil, nil, fmt.Errorf("nftables: rules of %s %s: %w", ch.Table.Name, ch.Name, err)
		}
		lines = append(lines, fmt.Sprintf("nft: chain %s %s %s: %d rules", family(ch.Table.Family), ch.Table.Name, ch.Name, len(rules)))
	}
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, nil, err
	}
	defer nl.Close()
	links, err := nl.LinkList()
	if err != nil {
		return nil, nil, fmt.Errorf("list links: %w", err)
	}
	var devs []string
	for _, lk := range links {
		name := lk.Attrs().Name
		devs = append(devs, name)
		for _, at := range []struct {
			dir    string
			attach ebpf.AttachType
		}{{"ingress", ebpf.AttachTCXIngress}, {"egress", ebpf.AttachTCXEgress}} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: lk.Attrs().Index, Attach: at.attach})
			if err != nil {
				if errors.Is(err, ebpf.ErrNotSupported) {
					break
				}
				return nil, nil, fmt.Errorf("query tcx %s of %s: %w", at.dir, name, err)
			}
			for _, p := range res.Programs {
				lines = append(lines, fmt.Sprintf("tcx %s %s: %s", name, at.dir, progName(p.ID)))
			}
		}
	}
	return lines, devs, nil
}

// cgroupAttachTypes are the cgroup attach points listed.
var cgroupAttachTypes = []ebpf.AttachType{
	ebpf.AttachCGroupInetIngress, ebpf.AttachCGroupInetEgress, ebpf.AttachCGroupInetSockCreate, ebpf.AttachCGroupSockOps,
	ebpf.AttachCGroupDevice, ebpf.AttachCGroupInet4Bind, ebpf.AttachCGroupInet6Bind, ebpf.AttachCGroupInet4Connect,
	ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupInet4PostBind, ebpf.AttachCGroupInet6PostBind,
	ebpf.AttachCGroupUDP4Sendmsg, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupSysctl, ebpf.AttachCGroupUDP4Recvmsg,
	ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCGroupGetsockopt, ebpf.AttachCGroupSetsockopt,
	ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInet6GetPeername, ebpf.AttachCgroupInet4GetSockname,
	ebpf.AttachCgroupInet6GetSockname, ebpf.AttachCgroupInetSockRelease,
}

// cgroupPrograms lists the programs attached to cgroup dir itself (not
// the ones it inherits).
func cgroupPrograms(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	defer f.Close()
	var lines []string
	for _, at := range cgroupAttachTypes {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
				continue // an attach type this kernel lacks
			}
			return nil, fmt.Errorf("query %s of cgroup %s: %w", at, dir, err)
		}
		for _, p := range res.Programs {
			lines = append(lines, fmt.Sprintf("cgroup %s %s: %s", dir, at, progName(p.ID)))
		}
	}
	return lines, nil
}

// progName is a program's name (its ID when the program is gone).
func progName(id ebpf.ProgramID) string {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return fmt.Sprintf("id %d", id)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Name == "" {
		return fmt.Sprintf("id %d", id)
	}
	return info.Name
}

// files lists everything below the node's directory dir (seen from here
// at root+dir): its type, and a regular file's content hash unless it
// lives in a bpffs (whose debug files change with every map).
func files(root, dir string) []string {
	base := root + dir
	var st unix.Statfs_t
	bpffs := unix.Statfs(base, &st) == nil && st.Type == unix.BPF_FS_MAGIC
	var lines []string
	_ = filepath.WalkDir(base, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == base {
			return nil
		}
		rel := dir + strings.TrimPrefix(p, base)
		switch {
		case e.IsDir():
			lines = append(lines, "file: "+rel+"/")
		case e.Type()&fs.ModeSymlink != 0:
			to, _ := os.Readlink(p)
			lines = append(lines, "file: "+rel+" -> "+to)
		case e.Type().IsRegular() && !bpffs:
			data, err := os.ReadFile(p)
			sum := "unreadable"
			if err == nil {
				sum = fmt.Sprintf("sha256 %x", sha256.Sum256(data))[:19]
			}
			lines = append(lines, "file: "+rel+" "+sum)
		default:
			lines = append(lines, "file: "+rel)
		}
		return nil
	})
	return lines
}

// family names an nftables table family.
func family(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	case nftables.TableFamilyBridge:
		return "bridge"
	}
	return fmt.Sprint(f)
}
