// Package podnet is the pod's side of an attachment: the veth whose peer
// is created directly in the pod's network namespace, the pod's addresses
// and routes, and the removal of an attachment's links. The agent uses it
// for a CNI ADD (POST /v1/attach); the plugin for CHECK and DEL.
package podnet
