package cni

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestDeployConflist: the conflist `make install` and the DaemonSet ship
// loads in libcni and parses with membrane-cni's defaults. Its
// "cniVersion" is one that CNI libraries before 1.2 read results of
// (containerd 1.6 and 1.7 vendor libcni 1.1, which refuses a 1.1.0
// result), while "cniVersions" lets newer libcni pick 1.1.0 and so call
// STATUS and GC.
func TestDeployConflist(t *testing.T) {
	const path = "../../../deploy/05-membrane.conflist"
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" {
		t.Errorf("libcni picks cniVersion %q, want 1.1.0 (STATUS, GC)", list.CNIVersion)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var top struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	// libcni 1.1 (containerd 1.6, 1.7) reads results up to 1.0.0 and
	// ignores cniVersions.
	if top.CNIVersion != "1.0.0" {
		t.Errorf("cniVersion = %q, want 1.0.0 (the newest containerd 1.6 and 1.7 read)", top.CNIVersion)
	}
	if len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "membrane-cni" {
		t.Fatalf("plugins = %+v", list.Plugins)
	}
	// libcni adds the list's name and version when it invokes a plugin.
	var m map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &m); err != nil {
		t.Fatal(err)
	}
	m["name"], m["cniVersion"] = list.Name, list.CNIVersion
	b, _ := json.Marshal(m)
	conf, err := ParseConfig(b)
	if err != nil {
		t.Fatal(err)
	}
	if conf.Socket != DefaultSocket || conf.DeleteQueueDir != DefaultDeleteQueueDir || !supported(list.CNIVersion) {
		t.Fatalf("conf = %+v", conf)
	}
	if _, err := os.Stat("../../../deploy/kubernetes/membrane.yaml"); err != nil {
		t.Fatal(err)
	}
}
