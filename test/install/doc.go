// Package install tests Membrane installed and removed the way an
// operator does it on a node: the DaemonSet's init container's
// install-cni, the agent on the Linux datapath with its production
// features on, and membrane-agent cleanup, which must leave the node as
// it was before the install (root; the node is a network namespace of
// the node harness).
package install
