package actors_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/testutil"
)

const namedEgress = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: to-http, namespace: ns}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEndpoints: [{matchLabels: {app: server}}]
    toPorts: [{ports: [{port: http, protocol: TCP}]}]
  ingress:
  - toPorts: [{ports: [{port: http, protocol: TCP}]}]
`

// Issue #35: an egress rule on a named port reaches the servers' identity
// on the numbers its endpoints declare, local ones (sent with their
// policy request) and remote ones (through the ipcache); an ingress rule
// on a named port opens the endpoint's own number only.
func TestNamedPortsLocalAndRemote(t *testing.T) {
	h := startSystem(t, nil)
	ctx := context.Background()
	pols, err := policy.Parse([]byte(namedEgress))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.sys.ImportPolicy(ctx, pols); err != nil {
		t.Fatal(err)
	}
	http := func(port uint16) policy.NamedPorts {
		return policy.NamedPorts{{Name: "http", Proto: policy.ProtoTCP, Port: port}}
	}
	srv := podSpec(t, "c-server", "ns", "server", "k8s:app=server", "k8s:io.kubernetes.pod.namespace=ns")
	srv.NamedPorts = http(8080)
	server := h.mustCreate(t, srv)
	cli := podSpec(t, "c-client", "ns", "client", "k8s:app=client", "k8s:io.kubernetes.pod.namespace=ns")
	cli.NamedPorts = http(8443)
	client := h.mustCreate(t, cli)
	allows := func(port uint16) bool {
		ep, ok := h.ix.Endpoint(client.ID)
		return ok && ep.Policy.Allows(server.Identity, port, policy.ProtoTCP, policy.Egress)
	}
	testutil.Eventually(t, "client egress to the local server's http", func() bool { return allows(8080) && !allows(9090) })
	if ep, _ := h.ix.Endpoint(client.ID); !ep.Policy.Allows(server.Identity, 8443, policy.ProtoTCP, policy.Ingress) ||
		ep.Policy.Allows(server.Identity, 8080, policy.ProtoTCP, policy.Ingress) {
		t.Fatalf("client ingress: want its own http (8443) only: %+v", ep.Policy)
	}

	// A remote endpoint of the servers' identity numbering http 9090.
	r := endpoint.Remote{IPs: []netip.Addr{netip.MustParseAddr("10.98.0.9")}, Identity: server.Identity, Node: "n2",
		NodeIP: netip.MustParseAddr("192.0.2.2"), NamedPorts: http(9090)}
	if err := h.sys.UpsertRemoteEndpoints(ctx, "k8s", []endpoint.Remote{r}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "client egress to the remote server's http too", func() bool { return allows(8080) && allows(9090) })
	if err := h.sys.DeleteRemoteEndpoints(ctx, "k8s", r.IPs); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the remote number goes with it", func() bool { return allows(8080) && !allows(9090) })
	if _, err := h.sys.DeleteEndpoint(ctx, server.ID, endpoint.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "and the local one with the server", func() bool { return !allows(8080) })
}
