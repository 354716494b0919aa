package main

import (
	"encoding/json"
	"fmt"
	"slices"

	cniversion "github.com/containernetworking/cni/pkg/version"
)

// Modes of install-cni's --host-ports: how the pods' hostPorts are done.
const (
	// hostPortsAsIs installs the conflist unchanged.
	hostPortsAsIs = ""
	// hostPortsBPF declares the portMappings capability on membrane-cni:
	// the agent translates them (--kube-proxy-replacement).
	hostPortsBPF = "bpf"
	// hostPortsPortmap chains the portmap plugin (with the capability)
	// after membrane-cni: iptables does them (kube-proxy on the node).
	hostPortsPortmap = "portmap"
)

// conflistForHostPorts returns the conflist raw for the hostPort mode:
// membrane-cni (the list's first plugin, which must be membrane-cni)
// with "capabilities": {"portMappings": true} in bpf mode, or portmap
// appended with that capability and SNAT (hairpin) in portmap mode. A
// conflist already holding portmap is refused in bpf mode (both would
// translate) and kept in portmap mode. In portmap mode the list's CNI
// versions ("cniVersion", and "cniVersions" when present) are cut to
// those portmapVersions holds (the installed portmap's VERSION answer):
// the runtime runs every plugin of the list at one version, and a
// portmap older than the list's highest version refuses every ADD. No
// version in common is an error.
func conflistForHostPorts(raw []byte, mode string, portmapVersions []string) ([]byte, error) {
	if mode == hostPortsAsIs {
		return raw, nil
	}
	if mode != hostPortsBPF && mode != hostPortsPortmap {
		return nil, fmt.Errorf("--host-ports %q: want bpf or portmap", mode)
	}
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("conflist: %w", err)
	}
	plugins, _ := list["plugins"].([]any)
	if len(plugins) == 0 {
		return nil, fmt.Errorf("conflist: no plugins")
	}
	first, _ := plugins[0].(map[string]any)
	if first == nil || first["type"] != "membrane-cni" {
		return nil, fmt.Errorf("conflist: the first plugin is not membrane-cni")
	}
	hasPortmap := false
	for _, p := range plugins[1:] {
		if m, _ := p.(map[string]any); m != nil && m["type"] == "portmap" {
			hasPortmap = true
		}
	}
	switch {
	case mode == hostPortsBPF && hasPortmap:
		return nil, fmt.Errorf("conflist: --host-ports bpf with portmap chained: both would map hostPorts")
	case mode == hostPortsBPF:
		caps, _ := first["capabilities"].(map[string]any)
		if caps == nil {
			caps = map[string]any{}
		}
		caps["portMappings"] = true
		first["capabilities"] = caps
	default:
		if !hasPortmap {
			list["plugins"] = append(plugins, map[string]any{"type": "portmap", "snat": true,
				"capabilities": map[string]any{"portMappings": true}})
		}
		if err := versionsForPortmap(list, portmapVersions); err != nil {
			return nil, err
		}
	}
	return json.MarshalIndent(list, "", "  ")
}

// versionsForPortmap cuts list's "cniVersion" and "cniVersions" to the
// versions portmap supports: "cniVersions" keeps those in supported,
// "cniVersion" becomes the highest of them when portmap does not
// support it.
func versionsForPortmap(list map[string]any, supported []string) error {
	cur, _ := list["cniVersion"].(string)
	wanted := []string{cur}
	raw, hasList := list["cniVersions"]
	if hasList {
		vs, ok := raw.([]any)
		if !ok {
			return fmt.Errorf("conflist: cniVersions is not a list")
		}
		wanted = wanted[:0]
		for _, v := range vs {
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("conflist: cniVersions holds %v, not a version", v)
			}
			wanted = append(wanted, s)
		}
		if cur != "" {
			wanted = append(wanted, cur)
		}
	}
	var common []string
	for _, v := range wanted {
		if _, _, _, err := cniversion.ParseVersion(v); err != nil {
			return fmt.Errorf("conflist: CNI version %q: %w", v, err)
		}
		if slices.Contains(supported, v) && !slices.Contains(common, v) {
			common = append(common, v)
		}
	}
	if len(common) == 0 {
		return fmt.Errorf("the portmap plugin supports CNI versions %v, the conflist wants %v: none in common (install containernetworking-plugins 1.0 or later)", supported, wanted)
	}
	slices.SortFunc(common, func(a, b string) int {
		if gt, _ := cniversion.GreaterThan(a, b); gt {
			return 1
		}
		if a == b {
			return 0
		}
		return -1
	})
	if hasList {
		kept := make([]any, len(common))
		for i, v := range common {
			kept[i] = v
		}
		list["cniVersions"] = kept
	}
	if !slices.Contains(common, cur) {
		list["cniVersion"] = common[len(common)-1]
	}
	return nil
}
