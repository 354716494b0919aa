//go:build linux

package e2e

import (
	"path/filepath"
)

// startControllers starts kube-controller-manager and kube-scheduler in
// the control-plane namespace, each as the user its bootstrap RBAC roles
// name (system:kube-controller-manager, system:kube-scheduler), the way
// kubeadm runs them. They need no wait: what they do (podCIDRs, tokens,
// scheduling) is waited for where it is needed.
func (c *cluster) startControllers() error {
	d := c.Dir
	for _, name := range []string{"kube-controller-manager", "kube-scheduler"} {
		if err := writeKubeconfig(filepath.Join(d, name+".kubeconfig"), apiServer, filepath.Join(d, "tls.crt"), c.tokens[name]); err != nil {
			return err
		}
	}
	kcm, err := c.run("kube-controller-manager", c.cpPid, false, filepath.Join(c.bin, "kube-controller-manager"),
		"--kubeconfig="+filepath.Join(d, "kube-controller-manager.kubeconfig"),
		"--authentication-kubeconfig="+filepath.Join(d, "kube-controller-manager.kubeconfig"),
		"--authorization-kubeconfig="+filepath.Join(d, "kube-controller-manager.kubeconfig"),
		"--bind-address=127.0.0.1", "--cert-dir="+filepath.Join(d, "kcm-certs"),
		// One instance: no leader election to wait for.
		"--leader-elect=false",
		// Every controller its own ServiceAccount's token (TokenRequest),
		// as kubeadm runs it; the token controller signs with the API
		// server's service-account key, the root CA publisher publishes
		// the serving certificate as kube-root-ca.crt.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+filepath.Join(d, "sa.key"),
		"--root-ca-file="+filepath.Join(d, "tls.crt"),
		// Node IPAM: each Node a /24 of the cluster CIDR (spec.podCIDRs).
		"--allocate-node-cidrs=true", "--cluster-cidr="+clusterCIDR.String(), "--node-cidr-mask-size=24",
		"--service-cluster-ip-range="+serviceCIDR.String(),
		// The default set ("*"): namespace, serviceaccount-token,
		// serviceaccount, root-ca-cert-publisher, nodeipam,
		// endpointslice, garbage-collector, deployment, replicaset,
		// nodelifecycle, ... (no cloud provider: the cloud ones stay off).
		"--controllers=*",
		"--profiling=false", "--v=1")
	if err != nil {
		return err
	}
	c.controllers = append(c.controllers, kcm)
	sched, err := c.run("kube-scheduler", c.cpPid, false, filepath.Join(c.bin, "kube-scheduler"),
		"--kubeconfig="+filepath.Join(d, "kube-scheduler.kubeconfig"),
		"--authentication-kubeconfig="+filepath.Join(d, "kube-scheduler.kubeconfig"),
		"--authorization-kubeconfig="+filepath.Join(d, "kube-scheduler.kubeconfig"),
		"--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false", "--v=1")
	if err != nil {
		return err
	}
	c.controllers = append(c.controllers, sched)
	return nil
}
