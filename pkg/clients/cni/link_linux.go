package cni

import (
	"errors"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netns"

	"github.com/membrane-cni/membrane/datapath/podnet"
)

// pod is an open pod netns (CHECK, DEL); the ADD's pod work is the
// agent's (POST /v1/attach).
type pod = podnet.Pod

func openPod(path string) (*pod, error) {
	p, err := podnet.Open(path, netns.None())
	if err != nil {
		return nil, podnetError(err)
	}
	return p, nil
}

// podnetError gives a podnet failure its CNI code.
func podnetError(err error) *types.Error {
	var pe *podnet.Error
	if errors.As(err, &pe) && pe.Kind == podnet.KindNetns {
		return newError(CodeNetns, "%v", err)
	}
	return newError(CodeKernel, "%v", err)
}
