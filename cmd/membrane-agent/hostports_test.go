package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/membrane-cni/membrane/pkg/clients/cni"
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
	bpf, err := conflistForHostPorts(raw, hostPortsBPF, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p := parse(bpf); len(p) != 1 || !p[0].Capabilities["portMappings"] {
		t.Errorf("bpf: %s", bpf)
	}
	pm, err := conflistForHostPorts(raw, hostPortsPortmap, cniAll)
	if err != nil {
		t.Fatal(err)
	}
	if p := parse(pm); len(p) != 2 || p[0].Capabilities["portMappings"] || p[1].Type != "portmap" || !p[1].Capabilities["portMappings"] {
		t.Errorf("portmap: %s", pm)
	}
	if again, err := conflistForHostPorts(pm, hostPortsPortmap, cniAll); err != nil || len(parse(again)) != 2 {
		t.Errorf("portmap twice: %s, %v", again, err)
	}
	if _, err := conflistForHostPorts(pm, hostPortsBPF, nil); err == nil {
		t.Errorf("bpf over a list with portmap: accepted")
	}
	if same, err := conflistForHostPorts(raw, hostPortsAsIs, nil); err != nil || string(same) != string(raw) {
		t.Errorf("as-is changed the list")
	}
	for _, bad := range []struct{ raw, mode string }{
		{string(raw), "iptables"}, {`{"plugins":[]}`, hostPortsBPF}, {`{"plugins":[{"type":"ptp"}]}`, hostPortsBPF}, {`[`, hostPortsPortmap},
	} {
		if _, err := conflistForHostPorts([]byte(bad.raw), bad.mode, cniAll); err == nil {
			t.Errorf("conflistForHostPorts(%s, %q) accepted", bad.raw, bad.mode)
		}
	}
}

// cniAll is a portmap that speaks every version the shipped conflist
// names.
var cniAll = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// TestConflistVersionsForPortmap: portmap mode cuts the list's CNI
// versions to those the installed portmap speaks (a portmap older than
// the list's highest version would refuse every ADD), keeps them when it
// speaks them all, and refuses a list it shares no version with.
func TestConflistVersionsForPortmap(t *testing.T) {
	type versions struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
	}
	for _, tc := range []struct {
		name, raw string
		portmap   []string
		want      versions
		err       string
	}{
		{"old portmap", `{"cniVersion":"1.0.0","cniVersions":["1.0.0","1.1.0"],"plugins":[{"type":"membrane-cni"}]}`,
			[]string{"0.3.1", "0.4.0", "1.0.0"}, versions{"1.0.0", []string{"1.0.0"}}, ""},
		{"current portmap", `{"cniVersion":"1.0.0","cniVersions":["1.1.0","1.0.0"],"plugins":[{"type":"membrane-cni"}]}`,
			cniAll, versions{"1.0.0", []string{"1.0.0", "1.1.0"}}, ""},
		{"cniVersion unsupported, one in the list", `{"cniVersion":"1.1.0","cniVersions":["0.4.0","1.1.0"],"plugins":[{"type":"membrane-cni"}]}`,
			[]string{"0.3.1", "0.4.0", "1.0.0"}, versions{"0.4.0", []string{"0.4.0"}}, ""},
		{"no list", `{"cniVersion":"1.0.0","plugins":[{"type":"membrane-cni"}]}`,
			[]string{"1.0.0"}, versions{"1.0.0", nil}, ""},
		{"nothing in common", `{"cniVersion":"1.1.0","cniVersions":["1.1.0"],"plugins":[{"type":"membrane-cni"}]}`,
			[]string{"0.3.1", "0.4.0", "1.0.0"}, versions{}, "none in common"},
		{"bad version", `{"cniVersion":"1.0.0","cniVersions":["one"],"plugins":[{"type":"membrane-cni"}]}`,
			cniAll, versions{}, `"one"`},
		{"bad list", `{"cniVersion":"1.0.0","cniVersions":"1.0.0","plugins":[{"type":"membrane-cni"}]}`,
			cniAll, versions{}, "not a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := conflistForHostPorts([]byte(tc.raw), hostPortsPortmap, tc.portmap)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one naming %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got versions
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			if got.CNIVersion != tc.want.CNIVersion || !slices.Equal(got.CNIVersions, tc.want.CNIVersions) {
				t.Errorf("versions %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestInstallCNIPortmap runs install-cni --host-ports portmap against
// the node's real portmap (Debian's containernetworking-plugins): the
// installed conflist chains portmap at a CNI version both it and
// membrane-cni speak, as libcni parses it. Without portmap in the bin
// directory install-cni fails, naming what is missing, and installs
// nothing.
func TestInstallCNIPortmap(t *testing.T) {
	const refPortmap = "/usr/lib/cni/portmap"
	if _, err := os.Stat(refPortmap); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: %v (.ci/run installs containernetworking-plugins)", refPortmap, err)
		}
		t.Skipf("%s: %v", refPortmap, err)
	}
	dir := t.TempDir()
	plugin := filepath.Join(dir, "membrane-cni")
	if err := os.WriteFile(plugin, []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	binDir, confDir := filepath.Join(dir, "bin"), filepath.Join(dir, "conf")
	for _, d := range []string{binDir, confDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--plugin", plugin, "--conflist", "../../deploy/05-membrane.conflist",
		"--cni-bin-dir", binDir, "--cni-conf-dir", confDir, "--host-ports", hostPortsPortmap}
	var stderr strings.Builder
	if rc := runInstallCNI(args, &stderr); rc != 1 || !strings.Contains(stderr.String(), "containernetworking-plugins") {
		t.Errorf("install-cni without portmap: rc %d, %q; want 1 naming containernetworking-plugins", rc, stderr.String())
	}
	if left, _ := os.ReadDir(confDir); len(left) != 0 {
		t.Errorf("install-cni without portmap installed %v", left)
	}
	if err := os.Symlink(refPortmap, filepath.Join(binDir, "portmap")); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	if rc := runInstallCNI(args, &stderr); rc != 0 {
		t.Fatalf("install-cni: rc %d, %s", rc, stderr.String())
	}
	list, err := libcni.ConfListFromFile(filepath.Join(confDir, "05-membrane.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	info, err := invoke.GetVersionInfo(context.Background(), refPortmap, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Plugins) != 2 || list.Plugins[1].Network.Type != "portmap" {
		t.Fatalf("installed list %s: want membrane-cni then portmap", list.Bytes)
	}
	var declared struct {
		CNIVersions []string `json:"cniVersions"`
	}
	if err := json.Unmarshal(list.Bytes, &declared); err != nil {
		t.Fatal(err)
	}
	for _, v := range append([]string{list.CNIVersion}, declared.CNIVersions...) {
		if !slices.Contains(info.SupportedVersions(), v) || !slices.Contains(cni.SupportedVersions, v) {
			t.Errorf("installed list names CNI version %s; portmap speaks %v, membrane-cni %v", v, info.SupportedVersions(), cni.SupportedVersions)
		}
	}
	t.Logf("installed: cniVersion %s, cniVersions %v (portmap speaks %v)", list.CNIVersion, declared.CNIVersions, info.SupportedVersions())
}
