package crash

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/membrane-cni/membrane/test/nodeharness"
)

// agentProc is a node and its membrane-agent process, which the test
// starts, kills and restarts on the same socket, state directory,
// delete queue and pins.
type agentProc struct {
	*nodeharness.Node
	*nodeharness.Proc
}

// newAgentProc is an agent process with extra flags on a node that is
// the test's own netns (the fake datapath needs no root).
func newAgentProc(t *testing.T, cidr string, extra ...string) *agentProc {
	t.Helper()
	n := nodeharness.New(t, nodeharness.Options{NoNetns: true, IPv4Range: cidr})
	return &agentProc{Node: n, Proc: n.Process(extra...)}
}

// cniDel runs the membrane-cni binary's DEL as a runtime would (used while
// the agent is down: the plugin queues the deletion).
func cniDel(t *testing.T, p *agentProc, network, containerID, pod string) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"type":"membrane-cni","socket":%q,"deleteQueueDir":%q}`,
		network, p.Socket, p.DeleteQueue)
	cmd := exec.Command(nodeharness.Bin("membrane-cni"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND=DEL", "CNI_CONTAINERID="+containerID, "CNI_NETNS=", "CNI_IFNAME=eth0",
		"CNI_PATH="+nodeharness.BinDir(), "CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+podNamespace+";K8S_POD_NAME="+pod)
	cmd.Stdin = bytes.NewBufferString(conf)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CNI DEL %s with the agent down: %v\n%s", containerID, err, out)
	}
}

// podNamespace is the Kubernetes namespace of every test pod.
const podNamespace = "crash"
