// Package v2 holds the Go types of Membrane's custom resources, group
// membrane.io, version v2 (Cilium's cilium.io/v2 counterparts renamed):
// MembraneIdentity (cluster-scoped; the object name is the numeric
// identity), MembraneEndpoint (namespaced, one per pod endpoint),
// MembraneNetworkPolicy and MembraneClusterwideNetworkPolicy (the spec of
// a CiliumNetworkPolicy, so a CNP converts by changing apiVersion and
// kind). Each kind has its own file. The agent reads and writes them with
// the dynamic client and runtime.DefaultUnstructuredConverter, so the
// types need no generated deep-copy code or scheme registration. Their
// CustomResourceDefinitions are in deploy/crds/, one file per kind.
package v2

import "k8s.io/apimachinery/pkg/runtime/schema"

const (
	// Group is Membrane's API group.
	Group = "membrane.io"
	// Version is the served and stored version.
	Version = "v2"
)

// GroupVersion is Group/Version.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

// Resource returns the GroupVersionResource of the plural resource name.
func Resource(plural string) schema.GroupVersionResource {
	return GroupVersion.WithResource(plural)
}
