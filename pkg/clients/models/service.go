package models

// Service is one row of GET /v1/service: a frontend with its backends,
// as the service table holds it, and what the BPF maps hold for it.
type Service struct {
	// Frontend is "addr:port/PROTO".
	Frontend string `json:"frontend"`
	Name     string `json:"name,omitempty"`
	PortName string `json:"port-name,omitempty"`
	Kind     string `json:"kind"`
	Source   string `json:"source"`
	// ID is the datapath's service number.
	ID       uint32   `json:"id"`
	Backends []string `json:"backends"`
	// AffinitySeconds is the ClientIP affinity timeout (0: none).
	AffinitySeconds int64 `json:"affinity-seconds,omitempty"`
	// State is pending, realized or failed (Error says why).
	State string `json:"state"`
	Error string `json:"error,omitempty"`
	// Realized is what the BPF maps hold for the frontend (absent
	// without ?maps=true or when the maps do not hold it).
	Realized *ServiceRealized `json:"realized,omitempty"`
}

// ServiceRealized is a frontend's entries in the BPF service maps.
type ServiceRealized struct {
	ID              uint32   `json:"id"`
	Backends        []string `json:"backends"`
	AffinitySeconds uint32   `json:"affinity-seconds,omitempty"`
	// External: translated on the uplinks too (kube-proxy-free mode).
	External bool `json:"external,omitempty"`
	// Local lists the backends flagged as on this node (NodePort traffic
	// to them is not SNATed).
	Local []string `json:"local,omitempty"`
}

// ServiceList is GET /v1/service's answer.
type ServiceList struct {
	Services []Service `json:"services"`
	// Maps counts the connection-level entries of the BPF maps (with
	// ?maps=true); MapsError says why they could not be read.
	Maps      *ServiceMapCounts `json:"maps,omitempty"`
	MapsError string            `json:"maps-error,omitempty"`
}

// ServiceMapCounts counts the BPF service maps' entries.
type ServiceMapCounts struct {
	Frontends   int `json:"frontends"`
	Backends    int `json:"backends"`
	Connections int `json:"connections"`
	ReverseNAT  int `json:"reverse-nat"`
	Affinity    int `json:"affinity"`
	// Orphans are frontends the maps hold that the table does not.
	Orphans []string `json:"orphans,omitempty"`
	// NodePortNAT counts NodePort connections from outside, NodePortSNAT
	// the SNATed ones' reply entries, Sockets the socket-level
	// translations (kube-proxy-free mode).
	NodePortNAT  int `json:"nodeport-nat"`
	NodePortSNAT int `json:"nodeport-snat"`
	Sockets      int `json:"sockets"`
	// Hooks is what the kube-proxy-free mode attached.
	Hooks ServiceHooks `json:"hooks"`
}

// ServiceHooks is what the kube-proxy-free mode attached: the socket
// programs on a cgroup and the NodePort program on the uplinks.
type ServiceHooks struct {
	KubeProxyReplacement bool     `json:"kube-proxy-replacement"`
	Cgroup               string   `json:"cgroup,omitempty"`
	SocketPrograms       []string `json:"socket-programs,omitempty"`
	Devices              []string `json:"devices,omitempty"`
}
