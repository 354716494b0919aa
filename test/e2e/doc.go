// Package e2e runs Membrane in a real Kubernetes cluster on one machine:
// a control plane (etcd, kube-apiserver with ServiceAccount admission,
// kube-controller-manager, kube-scheduler) in a network namespace of its
// own, CoreDNS as the cluster DNS (a Deployment behind the kube-dns
// Service, reached through Membrane's Service translation), and N worker
// nodes (E2E_NODES, default 2), each a network+mount namespace with its
// own containerd (Debian's, with runc), kubelet and membrane-agent,
// joined by an underlay bridge. Pods are created through the API server,
// placed by the scheduler (a test pins a pod to a node only where it
// needs to) and run a small static server (testdata/probe) from a local
// image; the tests probe them from inside the pods' network namespaces.
// Nodes get their pod ranges from the controller manager's node IPAM and
// Services their EndpointSlices from its EndpointSlice controller: the
// harness writes neither.
//
// The tests run only when MEMBRANE_E2E=1 (make e2e, make e2e-smoke); the
// cluster comes up once per test binary in TestMain and is torn down at
// the end, leaving no process, namespace, mount, cgroup or link behind,
// unless E2E_KEEP=1 keeps it for debugging (make e2e-down removes it).
// The kube binaries come from scripts/kube-bin.sh kubelet kube-scheduler
// kube-controller-manager, CoreDNS from scripts/coredns.sh (or
// E2E_COREDNS). Under CI=true a missing binary or capability fails
// instead of skipping.
package e2e
