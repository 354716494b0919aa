package main

import (
	"encoding/json"
	"os"
	"testing"
)

// TestConflistForHostPorts: the shipped conflist becomes, per mode,
// membrane-cni with the portMappings capability (bpf) or membrane-cni
// then portmap with it (portmap); bad modes and lists are refused.
func TestConflistForHostPorts(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/05-membrane.conflist")
	if err != nil {
		t.Fatal(err)
	}
	type plugin struct {
		Type         string          `json:"type"`
		Capabilities map[string]bool `json:"capabilities"`
	}
	parse := func(b []byte) []plugin {
		var l struct{ Plugins []plugin }
		if err := json.Unmarshal(b, &l); err != nil {
			t.Fatal(err)
		}
		return l.Plugins
	}
	bpf, err := conflistForHostPorts(raw, hostPortsBPF)
	if err != nil {
		t.Fatal(err)
	}
	if p := parse(bpf); len(p) != 1 || !p[0].Capabilities["portMappings"] {
		t.Errorf("bpf: %s", bpf)
	}
	pm, err := conflistForHostPorts(raw, hostPortsPortmap)
	if err != nil {
		t.Fatal(err)
	}
	if p := parse(pm); len(p) != 2 || p[0].Capabilities["portMappings"] || p[1].Type != "portmap" || !p[1].Capabilities["portMappings"] {
		t.Errorf("portmap: %s", pm)
	}
	if again, err := conflistForHostPorts(pm, hostPortsPortmap); err != nil || len(parse(again)) != 2 {
		t.Errorf("portmap twice: %s, %v", again, err)
	}
	if _, err := conflistForHostPorts(pm, hostPortsBPF); err == nil {
		t.Errorf("bpf over a list with portmap: accepted")
	}
	if same, err := conflistForHostPorts(raw, hostPortsAsIs); err != nil || string(same) != string(raw) {
		t.Errorf("as-is changed the list")
	}
	for _, bad := range []struct{ raw, mode string }{
		{string(raw), "iptables"}, {`{"plugins":[]}`, hostPortsBPF}, {`{"plugins":[{"type":"ptp"}]}`, hostPortsBPF}, {`[`, hostPortsPortmap},
	} {
		if _, err := conflistForHostPorts([]byte(bad.raw), bad.mode); err == nil {
			t.Errorf("conflistForHostPorts(%s, %q) accepted", bad.raw, bad.mode)
		}
	}
}
