package cni

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestDeployConflist: the conflist `make install` and the DaemonSet ship
// loads in libcni and parses with membrane-cni's defaults.
func TestDeployConflist(t *testing.T) {
	list, err := libcni.ConfListFromFile("../../../deploy/05-membrane.conflist")
	if err != nil {
		t.Fatal(err)
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
