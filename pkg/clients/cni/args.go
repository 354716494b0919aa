package cni

import (
	"strings"
)

// Args are the CNI_ARGS keys membrane-cni reads. Runtimes send
// "IgnoreUnknown=1;K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;
// K8S_POD_INFRA_CONTAINER_ID=..;K8S_POD_UID=.."; other keys are tolerated
// whatever IgnoreUnknown says.
type Args struct {
	Namespace        string
	Pod              string
	InfraContainerID string
	UID              string
}

// maxArgValue bounds a value (Kubernetes names are at most 253 bytes).
const maxArgValue = 253

// ParseArgs parses CNI_ARGS. Returns a CNI error 4 naming CNI_ARGS and
// the offending key for a pair without '=', a bad value, or a pod name
// given without its namespace (or the reverse).
func ParseArgs(s string) (Args, error) {
	var a Args
	for _, pair := range strings.Split(s, ";") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		key, val, ok := strings.Cut(pair, "=")
		if !ok || key == "" {
			return Args{}, envError("CNI_ARGS", "%q: want KEY=VALUE pairs separated by ';'", pair)
		}
		var dst *string
		switch key {
		case "K8S_POD_NAMESPACE":
			dst = &a.Namespace
		case "K8S_POD_NAME":
			dst = &a.Pod
		case "K8S_POD_INFRA_CONTAINER_ID":
			dst = &a.InfraContainerID
		case "K8S_POD_UID":
			dst = &a.UID
		default:
			continue // IgnoreUnknown and anything else a runtime adds
		}
		if !validArgValue(val) {
			return Args{}, envError("CNI_ARGS", "key %s: %q: want at most %d printable bytes without '/' or spaces", key, val, maxArgValue)
		}
		*dst = val
	}
	if (a.Namespace == "") != (a.Pod == "") {
		return Args{}, envError("CNI_ARGS", "K8S_POD_NAMESPACE and K8S_POD_NAME: give both or neither")
	}
	return a, nil
}

func validArgValue(v string) bool {
	if len(v) > maxArgValue {
		return false
	}
	for _, r := range v {
		if r <= ' ' || r == 0x7f || r == '/' || r == '%' || r == '?' || r == '#' {
			return false
		}
	}
	return true
}

// Owner is the IPAM owner string: "<namespace>/<pod>", or "" outside
// Kubernetes (the agent binds an unowned address to whichever endpoint
// claims it; a named owner must match the endpoint's pod).
func (a Args) Owner() string {
	if a.Namespace == "" {
		return ""
	}
	return a.Namespace + "/" + a.Pod
}
