package main

import (
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestHealthText(t *testing.T) {
	tests := []struct {
		name string
		h    models.HealthStatus
		want string
	}{
		{"dual-stack", models.HealthStatus{State: "ok", IP: "10.0.0.2", IPv6: "fd00::2", Endpoint: 7}, "ok (10.0.0.2 fd00::2, endpoint 7)"},
		{"ipv6-only", models.HealthStatus{State: "ok", IP: "fd00::2", Endpoint: 7}, "ok (fd00::2, endpoint 7)"},
		{"failing", models.HealthStatus{State: "failing", IP: "10.0.0.2", Endpoint: 7, Error: "timeout"}, "failing (10.0.0.2, endpoint 7): timeout"},
		{"disabled", models.HealthStatus{State: "disabled"}, "disabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := healthText(&tt.h); got != tt.want {
				t.Fatalf("healthText = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestK8sText(t *testing.T) {
	at := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		k    models.K8sStatus
		want string
	}{
		{"synced", models.K8sStatus{State: "synced", Node: "n1", Server: "https://10.0.0.1:6443",
			Synced: map[string]bool{"pods": true, "namespaces": true, "networkpolicies": true}, Pods: 3, Namespaces: 4, Policies: 1},
			"synced (node n1, https://10.0.0.1:6443), 3 pods, 4 namespaces, 1 networkpolicies"},
		{"syncing", models.K8sStatus{State: "sync-timeout", Node: "n1", Server: "s",
			Synced: map[string]bool{"pods": false, "namespaces": true, "networkpolicies": false}, PolicyErrors: 2, Queue: 5},
			"sync-timeout (node n1, s), not synced: networkpolicies pods, 0 pods, 0 namespaces, 0 networkpolicies, 2 refused, 5 queued"},
		{"disconnected", models.K8sStatus{State: "synced", Node: "n1", Server: "s", Connection: "disconnected",
			LastError: "connection refused", LastErrorAt: &at, MembranePolicies: 2,
			Synced: map[string]bool{"pods": true, "membranenetworkpolicies": false}},
			"synced (node n1, s), disconnected (connection refused at 2026-11-27T05:00:00Z), not synced: membranenetworkpolicies, 0 pods, 0 namespaces, 0 networkpolicies, 2 membrane policies"},
		{"cluster", models.K8sStatus{State: "synced", Node: "n1", Server: "s",
			Synced:                map[string]bool{"pods": true, "nodes": true, "membraneendpoints": false},
			RemoteEndpointsSynced: true, RemoteEndpoints: 7, PodCIDRWarning: "now [10.0.1.0/24]"},
			"synced (node n1, s), not synced: membraneendpoints, 0 pods, 0 namespaces, 0 networkpolicies, 7 remote endpoints, pod CIDRs changed (now [10.0.1.0/24])"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := k8sText(&tt.k); got != tt.want {
				t.Fatalf("k8sText = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestClusterIdentityText(t *testing.T) {
	since := time.Date(2026, 11, 27, 5, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		c    models.ClusterIdentityStatus
		want string
	}{
		{"healthy", models.ClusterIdentityStatus{Backend: "kubernetes", Healthy: true, Synced: true, Known: 12, InUse: 3},
			"kubernetes, healthy, synced, 12 known, 3 in use"},
		{"waiting", models.ClusterIdentityStatus{Backend: "kubernetes", Since: since, Synced: true, Known: 12, InUse: 3,
			Waiting: 1, WaitingLabels: []string{"k8s:app=web;"}, LastError: "connection refused"},
			"kubernetes, unreachable since 2026-11-27T05:00:00Z, synced, 12 known, 3 in use, 1 waiting (k8s:app=web;): connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := clusterIdentityText(&tt.c); got != tt.want {
				t.Fatalf("clusterIdentityText = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestKvstoreText(t *testing.T) {
	tests := []struct {
		name string
		k    models.KvstoreStatus
		want string
	}{
		{"healthy", models.KvstoreStatus{Backend: "etcd", Healthy: true, Synced: true, Node: "n1", Endpoints: []string{"https://a:2379", "https://b:2379"},
			Published: 4, RemoteEndpoints: 30, RemoteNodes: 2},
			"etcd healthy (node n1, https://a:2379,https://b:2379), 4 published, 30 remote endpoints, 2 remote nodes"},
		{"down", models.KvstoreStatus{Backend: "etcd", Node: "n1", Endpoints: []string{"http://a:2379"}, LeaseRegrants: 1, LastError: "context deadline exceeded"},
			"etcd unreachable (node n1, http://a:2379), not synced, 0 published, 0 remote endpoints, 0 remote nodes, lease lost 1 times: context deadline exceeded"},
		{"kept", models.KvstoreStatus{Backend: "etcd", Healthy: true, Synced: true, Node: "n1", Endpoints: []string{"http://a:2379"}, LeaseKept: 2},
			"etcd healthy (node n1, http://a:2379), 0 published, 0 remote endpoints, 0 remote nodes, keep-alive late and lease kept 2 times"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := kvstoreText(&tt.k); got != tt.want {
				t.Fatalf("kvstoreText = %q, want %q", got, tt.want)
			}
		})
	}
}
