// Package cri tests membrane-cni the way kubelet drives it: through
// containerd's CRI (crictl runp/inspectp/stopp/rmp), with containerd, its
// shims and a real agent on the Linux datapath in a private mount+network
// namespace the test makes and removes. Needs root, containerd, runc, ctr,
// crictl (PATH or $HOME/.cache/membrane/bin, see scripts/cri-tools.sh) and
// the loopback CNI plugin; it skips without them unless CI is set.
package cri
