// Package e2e runs Membrane in a real Kubernetes cluster on one machine:
// etcd and kube-apiserver in a control-plane network namespace, and N
// worker nodes (E2E_NODES, default 2), each a network+mount namespace
// with its own containerd (Debian's, with runc), kubelet and
// membrane-agent, joined by an underlay bridge. Pods are created through
// the API server and run a small static server (testdata/probe) from a
// local image; the tests probe them from inside the pods' network
// namespaces.
//
// The tests run only when MEMBRANE_E2E=1 (make e2e, make e2e-smoke); the
// cluster comes up once per test binary in TestMain and is torn down at
// the end, leaving no process, namespace, mount, cgroup or link behind,
// unless E2E_KEEP=1 keeps it for debugging (make e2e-down removes it).
// Kubelet comes from scripts/kube-bin.sh kubelet. Under CI=true a
// missing binary or capability fails instead of skipping.
package e2e
