package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/cluster"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestAllNodesTable(t *testing.T) {
	var out bytes.Buffer
	a := &app{out: &out, output: "table"}
	nodes := []cluster.NodeStatus{
		{Node: "n1", Pod: "a-1", Ready: true, PolicyRevision: 7, Drops: 5, DropReasons: map[string]uint64{"policy-denied": 4, "no-route": 1},
			Status: &models.Status{State: "ok", Endpoints: 3, Ready: 3, Identities: 9, K8s: &models.K8sStatus{Connection: "connected"}},
			Health: &models.HealthReport{Local: &models.HealthStatus{State: "ok"},
				Nodes: []models.NodeHealth{{Name: "n2", State: "ok"}, {Name: "n3", State: "unreachable"}}}},
		{Node: "n2", Pod: "a-2", Error: "exec refused"},
		{Node: "n3", Pod: "a-3", Status: &models.Status{State: "starting", Kvstore: &models.KvstoreStatus{Healthy: true}}},
	}
	if err := a.allNodesTable(nodes); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"NODE", "POLICY-REV",
		"n1", "ok", "3 (3 ready)", "5 (no-route 1, policy-denied 4)", "k8s connected", "local ok, 1/2 nodes ok (n3 unreachable)",
		"n2", "unknown", "error: exec refused",
		"n3", "starting (pod not ready)", "etcd healthy",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if lines := strings.Count(strings.TrimSpace(got), "\n") + 1; lines != 4 {
		t.Errorf("%d lines, want a header and 3 nodes:\n%s", lines, got)
	}
}

func TestConnectivityOut(t *testing.T) {
	var out bytes.Buffer
	a := &app{out: &out, output: "table"}
	r := &cluster.ConnectivityReport{Namespace: "ct", Nodes: []string{"n1", "n2"}, Passed: 1, Failed: 1, Skipped: 1,
		Checks: []cluster.CheckResult{{Name: "pod-to-pod/same-node", Result: "pass"}, {Name: "pod-to-world", Result: "fail", Detail: "timeout"},
			{Name: "l7-policy/allowed-path", Result: "skip", Detail: "no proxy"}}, Cleanup: "namespace stuck"}
	if err := a.connectivityOut(r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CHECK", "pod-to-world", "fail", "timeout", "1 passed, 1 failed, 1 skipped on n1, n2 (namespace ct); cleanup: namespace stuck"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
