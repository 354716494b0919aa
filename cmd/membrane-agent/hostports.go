package main

import (
	"encoding/json"
	"fmt"
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
// translate) and kept in portmap mode.
func conflistForHostPorts(raw []byte, mode string) ([]byte, error) {
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
	case !hasPortmap:
		list["plugins"] = append(plugins, map[string]any{"type": "portmap", "snat": true,
			"capabilities": map[string]any{"portMappings": true}})
	}
	return json.MarshalIndent(list, "", "  ")
}
