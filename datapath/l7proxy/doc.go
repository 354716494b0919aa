// Package l7proxy is the L7 (HTTP) proxy of the Linux datapath: the
// proxy itself (a process of its own, cmd/membrane-proxy, which runs
// RunProxy), the xDS server the agent configures it through (Server, on
// a unix socket), the tracking of the configuration versions it
// acknowledged or rejected (Tracker), and the supervisor that starts and
// restarts it (Supervisor).
//
// The configuration is one xDS resource type served over the aggregated
// discovery service (go-control-plane's server and LinearCache): one
// resource per endpoint with L7 policy ("ep/<id>", an EndpointPolicy)
// and one "ipcache" resource (IPCache). Each resource is a JSON document
// in a google.protobuf.BytesValue: this machine has no protoc to
// generate a dedicated message, and the JSON documents are the policy
// model's own types. The version is the LinearCache's counter ("v<N>");
// the proxy acknowledges a version after applying it whole, or rejects
// it (error_detail set) leaving the previous one in force.
package l7proxy
