package api_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/membrane-cni/membrane/pkg/agent/api"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// TestAttachments: endpoints are keyed by CNI attachment (container ID and
// interface), as the CNI spec keys them: one container may have several
// (Multus), each addressable as cni-attachment-id:<cid>:<ifname> and
// deletable alone; the same attachment twice is a conflict.
func TestAttachments(t *testing.T) {
	e := startHandlersAgent(t, nil)
	put := func(ifname string) response {
		return e.do(t, "PUT", "/v1/endpoint/cni-attachment-id:multi:"+ifname, `{"labels":["k8s:app=multi"],"sync-build":true}`)
	}
	for _, ifname := range []string{"eth0", "net1", "net2"} {
		if r := put(ifname); r.status != http.StatusCreated && r.status != http.StatusOK {
			t.Fatalf("PUT attachment %s: status %d: %s", ifname, r.status, r.body)
		}
	}
	expectError(t, put("net1"), http.StatusConflict, api.CodeConflict, "net1")

	get := func(ifname string) models.Endpoint {
		t.Helper()
		r := e.do(t, "GET", "/v1/endpoint/cni-attachment-id:multi:"+ifname, "")
		var ep models.Endpoint
		if r.status != http.StatusOK || json.Unmarshal(r.body, &ep) != nil {
			t.Fatalf("GET attachment %s: status %d: %s", ifname, r.status, r.body)
		}
		return ep
	}
	eth0, net1 := get("eth0"), get("net1")
	if eth0.ID == net1.ID || eth0.ContainerInterfaceName != "eth0" || net1.ContainerInterfaceName != "net1" || net1.ContainerID != "multi" {
		t.Fatalf("attachments eth0 = %+v, net1 = %+v", eth0, net1)
	}

	// One attachment alone.
	r := e.do(t, "DELETE", "/v1/endpoint", `{"container-id":"multi","container-interface-name":"net1"}`)
	var res models.EndpointBatchDeleteResponse
	if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil || len(res.Deleted) != 1 || res.Deleted[0] != net1.ID {
		t.Fatalf("DELETE net1: status %d: %s", r.status, r.body)
	}
	expectError(t, e.do(t, "GET", "/v1/endpoint/cni-attachment-id:multi:net1", ""), http.StatusNotFound, api.CodeNotFound, "")
	expectError(t, e.do(t, "DELETE", "/v1/endpoint", `{"container-id":"multi","container-interface-name":"net1"}`), http.StatusNotFound, api.CodeNotFound, "net1")
	expectError(t, e.do(t, "DELETE", "/v1/endpoint", `{"container-id":"multi","container-interface-name":"../x"}`), http.StatusBadRequest, api.CodeInvalid, "container-interface-name")
	if got := get("eth0"); got.ID != eth0.ID {
		t.Fatalf("eth0 after deleting net1 = %+v", got)
	}

	// Without an interface: every attachment of the container.
	r = e.do(t, "DELETE", "/v1/endpoint", `{"container-id":"multi"}`)
	if r.status != http.StatusOK || json.Unmarshal(r.body, &res) != nil || len(res.Deleted) != 2 {
		t.Fatalf("DELETE container: status %d: %s", r.status, r.body)
	}
	expectError(t, e.do(t, "GET", "/v1/endpoint/container-id:multi", ""), http.StatusNotFound, api.CodeNotFound, "")
}
