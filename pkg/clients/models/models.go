package models

import "time"

// AddressPair is a pair of IPv4 and IPv6 addresses; either may be empty.
type AddressPair struct {
	IPv4 string `json:"ipv4,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
}

// EndpointChangeRequest is the body of PUT /v1/endpoint/{id}.
type EndpointChangeRequest struct {
	// ID is the endpoint ID; 0 lets the agent pick one.
	ID int64 `json:"id,omitempty"`
	// ContainerID is the runtime's container (sandbox) ID; unique per node.
	ContainerID string `json:"container-id,omitempty"`
	// ContainerName is the runtime's name for the container.
	ContainerName string `json:"container-name,omitempty"`
	// ContainerInterfaceName is the interface name inside the pod (CNI_IFNAME).
	ContainerInterfaceName string `json:"container-interface-name,omitempty"`
	// K8sNamespace and K8sPodName name the pod.
	K8sNamespace string `json:"k8s-namespace,omitempty"`
	K8sPodName   string `json:"k8s-pod-name,omitempty"`
	// K8sUID is the pod's UID.
	K8sUID string `json:"k8s-uid,omitempty"`
	// Labels are source-prefixed labels, e.g. "k8s:app=web".
	Labels []string `json:"labels,omitempty"`
	// Addressing holds the IPs the endpoint uses (allocated by POST /v1/ipam).
	Addressing *AddressPair `json:"addressing,omitempty"`
	// InterfaceName and InterfaceIndex name the host-side interface.
	InterfaceName  string `json:"interface-name,omitempty"`
	InterfaceIndex int64  `json:"interface-index,omitempty"`
	// Mac is the pod-side MAC address, HostMac the host side's.
	Mac     string `json:"mac,omitempty"`
	HostMac string `json:"host-mac,omitempty"`
	// Netns is the path of the pod's network namespace.
	Netns string `json:"netns,omitempty"`
	// NamedPorts are the ports the pod's containers declare by name
	// (containers[].ports[]), which policies on named ports resolve to.
	NamedPorts []NamedPort `json:"named-ports,omitempty"`
	// SyncBuild asks the agent to answer only after the first regeneration.
	SyncBuild bool `json:"sync-build,omitempty"`
}

// NamedPort is a port a pod's container declares under a name (Cilium's
// Port model): Name an IANA_SVC_NAME, Port 1..65535, Protocol TCP (the
// default), UDP or SCTP.
type NamedPort struct {
	Name     string `json:"name"`
	Port     int64  `json:"port"`
	Protocol string `json:"protocol,omitempty"`
}

// Identity is a security identity: a numeric ID bound to a label set.
type Identity struct {
	ID       int64    `json:"id"`
	Labels   []string `json:"labels"`
	RefCount int      `json:"ref-count,omitempty"`
	Reserved bool     `json:"reserved,omitempty"`
	// Scope is set with a cluster identity store: "cluster" (in the store
	// and used on this node) or "remote" (in the store, used only on
	// other nodes); "node" is another node's own identity
	// (--enable-node-selector-labels: this agent's number for the node's
	// labels, not in any store).
	Scope string `json:"scope,omitempty"`
}

// Endpoint is the agent's view of one endpoint (GET /v1/endpoint/{id}).
type Endpoint struct {
	ID                     int64        `json:"id"`
	State                  string       `json:"state"`
	ContainerID            string       `json:"container-id,omitempty"`
	ContainerName          string       `json:"container-name,omitempty"`
	ContainerInterfaceName string       `json:"container-interface-name,omitempty"`
	K8sNamespace           string       `json:"k8s-namespace,omitempty"`
	K8sPodName             string       `json:"k8s-pod-name,omitempty"`
	K8sUID                 string       `json:"k8s-uid,omitempty"`
	Labels                 []string     `json:"labels"`
	Identity               *Identity    `json:"identity,omitempty"`
	Addressing             *AddressPair `json:"addressing,omitempty"`
	InterfaceName          string       `json:"interface-name,omitempty"`
	InterfaceIndex         int64        `json:"interface-index,omitempty"`
	Mac                    string       `json:"mac,omitempty"`
	HostMac                string       `json:"host-mac,omitempty"`
	Netns                  string       `json:"netns,omitempty"`
	// Chained says another CNI plugin made the host interface and the
	// addresses (chaining): the agent only attaches its programs.
	Chained bool `json:"chained,omitempty"`
	// PolicyAuditMode says the endpoint's policy is in audit mode (the
	// pod annotation policy.membrane.io/audit-mode): what it would drop
	// passes and is reported.
	PolicyAuditMode bool `json:"policy-audit-mode,omitempty"`
	// PolicyRevision is the revision realised by the last completed regeneration.
	PolicyRevision uint64 `json:"policy-revision"`
	// Regenerations counts completed regenerations.
	Regenerations uint64 `json:"regenerations"`
	// LastError is the last regeneration or datapath error, if any.
	LastError string    `json:"last-error,omitempty"`
	Created   time.Time `json:"created"`
	// StateChanged is when State last changed.
	StateChanged time.Time `json:"state-changed"`
}

// EndpointBatchDeleteRequest is the body of DELETE /v1/endpoint.
type EndpointBatchDeleteRequest struct {
	ContainerID string `json:"container-id"`
	// ContainerInterfaceName, when set, limits the deletion to the
	// container's attachment with this interface (a Membrane addition to
	// Cilium's model); without it every endpoint of the container goes.
	ContainerInterfaceName string `json:"container-interface-name,omitempty"`
}

// EndpointBatchDeleteResponse reports what DELETE /v1/endpoint removed.
type EndpointBatchDeleteResponse struct {
	Deleted []int64 `json:"deleted"`
}

// LabelsPatch is the body of PATCH /v1/endpoint/{id}/labels.
type LabelsPatch struct {
	Add    []string `json:"add,omitempty"`
	Delete []string `json:"delete,omitempty"`
}

// EndpointHealth is the body of GET /v1/endpoint/{id}/healthz.
type EndpointHealth struct {
	// Code is "endpoint-unhealthy" when the answer is 503, so the body is
	// also an Error (Message says why).
	Code     string `json:"code,omitempty"`
	ID       int64  `json:"id"`
	State    string `json:"state"`
	Healthy  bool   `json:"healthy"`
	Datapath string `json:"datapath"`
	Message  string `json:"message,omitempty"`
}

// IPAMAddressResponse describes one allocated address.
type IPAMAddressResponse struct {
	IP      string   `json:"ip"`
	Gateway string   `json:"gateway"`
	Cidrs   []string `json:"cidrs"`
	Owner   string   `json:"owner,omitempty"`
}

// NodeAddressingElement describes the node's addressing for one family.
type NodeAddressingElement struct {
	Enabled    bool   `json:"enabled"`
	IP         string `json:"ip,omitempty"`
	AllocRange string `json:"alloc-range,omitempty"`
}

// NodeAddressing is the node's addressing per family.
type NodeAddressing struct {
	IPv4 *NodeAddressingElement `json:"ipv4,omitempty"`
	IPv6 *NodeAddressingElement `json:"ipv6,omitempty"`
}

// IPAMResponse is the body answered by POST /v1/ipam.
type IPAMResponse struct {
	Address        *AddressPair         `json:"address"`
	HostAddressing *NodeAddressing      `json:"host-addressing"`
	IPv4           *IPAMAddressResponse `json:"ipv4,omitempty"`
	IPv6           *IPAMAddressResponse `json:"ipv6,omitempty"`
}

// IPAMAllocation is one allocated IP and its owner.
type IPAMAllocation struct {
	IP       string `json:"ip"`
	Owner    string `json:"owner"`
	Endpoint int64  `json:"endpoint,omitempty"`
}

// IPAMFamilyStatus reports one family's pool.
type IPAMFamilyStatus struct {
	Cidr        string           `json:"cidr"`
	Gateway     string           `json:"gateway"`
	Size        int              `json:"size"`
	Used        int              `json:"used"`
	Free        int              `json:"free"`
	Allocations []IPAMAllocation `json:"allocations"`
}

// IPAMStatus is the body of GET /v1/ipam.
type IPAMStatus struct {
	IPv4 *IPAMFamilyStatus `json:"ipv4,omitempty"`
	IPv6 *IPAMFamilyStatus `json:"ipv6,omitempty"`
}

// Status is the body of GET /v1/status.
type Status struct {
	// Code is the API's error code when the answer is not 200 (503
	// "starting" or "shutting-down"), so the body is also an Error.
	Code       string      `json:"code,omitempty"`
	State      string      `json:"state"`
	Message    string      `json:"message,omitempty"`
	Version    string      `json:"version,omitempty"`
	Datapath   string      `json:"datapath"`
	Endpoints  int         `json:"endpoints"`
	Ready      int         `json:"endpoints-ready"`
	Identities int         `json:"identities"`
	IPAM       *IPAMStatus `json:"ipam,omitempty"`
	Started    time.Time   `json:"started"`
	// Health is the health endpoint's state, as the agent last probed it.
	Health *HealthStatus `json:"health,omitempty"`
	// Restore is what the restore at the agent's start did (absent
	// until it finished).
	Restore *RestoreStatus `json:"restore,omitempty"`
	// K8s is the connection to the Kubernetes API server (absent in
	// standalone mode).
	K8s *K8sStatus `json:"k8s,omitempty"`
	// L7Proxy is the L7 proxy's state (absent when L7 is off).
	L7Proxy *L7ProxyStatus `json:"l7Proxy,omitempty"`
	// ClusterIdentity is the cluster-wide identity store (absent with the
	// node-local allocator).
	ClusterIdentity *ClusterIdentityStatus `json:"cluster-identity,omitempty"`
	// Kvstore is the connection to etcd (absent unless --kvstore etcd).
	Kvstore *KvstoreStatus `json:"kvstore,omitempty"`
	// Flows is the flow log's state and losses (absent without one).
	Flows *FlowStats `json:"flows,omitempty"`
	// StateDir is the state directory's health (absent before the store
	// opened).
	StateDir *StateDirStatus `json:"state-dir,omitempty"`
	// BPFPins is the linux datapath's check of its pins under the bpffs
	// (absent with the fake datapath).
	BPFPins *BPFPinsStatus `json:"bpf-pins,omitempty"`
}

// BPFPinsStatus reports the checks of the agent's BPF pins: pins removed
// under the running agent (an operator's cleanup, a fresh bpffs mounted
// over the directory) are pinned again from the objects it holds.
type BPFPinsStatus struct {
	Path string `json:"path"`
	// Healthy is false while the last repair left pins missing.
	Healthy bool `json:"healthy"`
	// Repairs counts the checks that found pins missing, Repinned the
	// pins made again in all.
	Repairs  int `json:"repairs"`
	Repinned int `json:"repinned"`
	// LastRepair is when the last such check ran and LastMessage what it
	// found and did.
	LastRepair  time.Time `json:"last-repair,omitempty"`
	LastMessage string    `json:"last-message,omitempty"`
}

// StateDirStatus reports the state directory: while it is unhealthy
// (full, read-only, failing I/O) new endpoints and state changes are
// refused, the endpoints in the kernel keep working, and the agent
// probes it until it works again.
type StateDirStatus struct {
	Path    string `json:"path"`
	Healthy bool   `json:"healthy"`
	// Cause is read-only, disk-full, io-error or failing ("" when
	// healthy); LastError the failure that made it unhealthy.
	Cause     string    `json:"cause,omitempty"`
	LastError string    `json:"last-error,omitempty"`
	Since     time.Time `json:"since"`
}

// KvstoreStatus reports the agent's kvstore (etcd) connection.
type KvstoreStatus struct {
	// Backend is "etcd".
	Backend string `json:"backend"`
	// Endpoints are etcd's client URLs; Node is this node's name.
	Endpoints []string `json:"endpoints"`
	Node      string   `json:"node"`
	// Healthy is false while etcd cannot be reached; Since is when it
	// last changed; LastError is the most recent failure.
	Healthy   bool      `json:"healthy"`
	Since     time.Time `json:"since"`
	LastError string    `json:"last-error,omitempty"`
	// Lease is the node lease's ID (0: none granted yet); LeaseRegrants
	// counts leases granted after the first (each one a lost lease);
	// LeaseKept the keep-alives that lapsed while etcd still held the
	// lease, which was kept with its keys (nothing written again).
	Lease         int64 `json:"lease"`
	LeaseRegrants int   `json:"lease-regrants"`
	LeaseKept     int   `json:"lease-kept"`
	// Synced is true once the remote endpoints and nodes were listed.
	Synced bool `json:"synced"`
	// Published counts this node's keys (itself and its endpoints);
	// RemoteEndpoints and RemoteNodes what the other nodes published.
	Published       int `json:"published"`
	RemoteEndpoints int `json:"remote-endpoints"`
	RemoteNodes     int `json:"remote-nodes"`
	// Behind is true while the other nodes' endpoint changes wait longer
	// than the agent's threshold (5 s) to reach the ipcache: the agent
	// cannot keep up with the cluster's churn (or the ipcache is slow)
	// and queues them. RemotePending counts the addresses whose change
	// waits (a later change to an address replaces its earlier one),
	// RemoteBehindSeconds is the age of the oldest, and
	// RemoteMaxBehindSeconds the largest seen since the agent started.
	Behind                 bool    `json:"behind,omitempty"`
	RemotePending          int     `json:"remote-pending,omitempty"`
	RemoteBehindSeconds    float64 `json:"remote-behind-seconds,omitempty"`
	RemoteMaxBehindSeconds float64 `json:"remote-max-behind-seconds,omitempty"`
}

// L7ProxyStatus reports the L7 proxy process and its configuration
// versions: the current one, the highest it acknowledged, the endpoint
// revisions waiting for an acknowledgement, and its rejections.
type L7ProxyStatus struct {
	PID      int    `json:"pid"`
	Restarts int    `json:"restarts"`
	LastExit string `json:"lastExit,omitempty"`
	Version  uint64 `json:"version"`
	Acked    uint64 `json:"acked"`
	Pending  int    `json:"pending"`
	Nacks    uint64 `json:"nacks"`
	LastNack string `json:"lastNack,omitempty"`
	// Port is the proxy's listening port, the one the policy maps
	// redirect L7 entries to.
	Port uint16 `json:"port,omitempty"`
	// Endpoints are the endpoints with L7 configuration: the version of
	// each one's and whether the proxy acknowledged it.
	Endpoints []L7EndpointVersion `json:"endpoints,omitempty"`
}

// L7EndpointVersion is an endpoint's L7 configuration version and
// whether the proxy acknowledged it.
type L7EndpointVersion struct {
	ID      int64  `json:"id"`
	Version uint64 `json:"version"`
	Acked   bool   `json:"acked"`
}

// K8sStatus reports the agent's Kubernetes watchers.
type K8sStatus struct {
	// Node is the node whose pods the agent watches.
	Node string `json:"node"`
	// Server is the API server's address.
	Server string `json:"server"`
	// State is "syncing" (caches not synced yet), "synced", or
	// "sync-timeout" (the bounded wait at start ended first; the agent
	// serves anyway and keeps syncing).
	State string `json:"state"`
	// Synced says per watched resource (pods, namespaces,
	// networkpolicies) whether its cache synced.
	Synced map[string]bool `json:"synced"`
	// Pods, Namespaces and Policies count the cached objects.
	Pods       int `json:"pods"`
	Namespaces int `json:"namespaces"`
	Policies   int `json:"networkpolicies"`
	// MembranePolicies counts the cached MembraneNetworkPolicies and
	// MembraneClusterwideNetworkPolicies.
	MembranePolicies int `json:"membrane-policies"`
	// PolicyErrors counts policies the agent refused whole (see the log,
	// the objects' events and the custom resources' status).
	PolicyErrors int `json:"policy-errors"`
	// PoliciesPartial counts policies imported with parts refused: the
	// rest is in force and the pods they select stay isolated; the
	// refused parts allow nothing (see the objects' events and status).
	PoliciesPartial int `json:"policies-partial"`
	// Connection is "connecting" (no answer yet), "connected" or
	// "disconnected": the last /readyz probe's outcome. While
	// disconnected, running endpoints keep working and CNI ADDs use the
	// cached pods; the informers resume when the API server is back.
	Connection string `json:"connection"`
	// LastError is the last probe or watch error, LastErrorAt its time.
	LastError   string     `json:"last-error,omitempty"`
	LastErrorAt *time.Time `json:"last-error-at,omitempty"`
	// LastContact is the last successful probe.
	LastContact *time.Time `json:"last-contact,omitempty"`
	// Disconnects counts the times the connection was lost.
	Disconnects int `json:"disconnects"`
	// Queue is the number of changes waiting to be applied.
	Queue int `json:"queue"`
	// RemoteEndpoints counts the other nodes' endpoint objects held;
	// RemoteEndpointsSynced says whether their first full set reached
	// the ipcache.
	RemoteEndpoints       int  `json:"remote-endpoints"`
	RemoteEndpointsSynced bool `json:"remote-endpoints-synced"`
	// EndpointStatusQueue is the number of endpoint status objects
	// waiting to be written.
	EndpointStatusQueue int `json:"endpoint-status-queue"`
	// Nodes counts the other nodes last handed to the datapath;
	// NodeSyncError is why the last hand-over failed ("" if it did not).
	Nodes         int    `json:"nodes"`
	NodeSyncError string `json:"node-sync-error,omitempty"`
	// PodCIDRs are the IPAM ranges taken from the Node object (--ipam
	// kubernetes); PodCIDRWarning says that the Node's spec.podCIDRs
	// changed since (the agent keeps allocating from PodCIDRs).
	PodCIDRs       []string `json:"pod-cidrs,omitempty"`
	PodCIDRWarning string   `json:"pod-cidr-warning,omitempty"`
}

// RestoreStatus counts what the restore at the agent's start did with the
// endpoint state it found.
type RestoreStatus struct {
	// Found is how many state directories were read.
	Found int `json:"found"`
	// Restored is how many endpoints came back.
	Restored int `json:"restored"`
	// Invalid is how many did not survive the agent's absence (their
	// datapath was gone) and were deleted.
	Invalid int `json:"invalid"`
	// Refused is how many the agent refused (a conflict with another
	// endpoint's ID, container or address, or leases it could not take).
	Refused int `json:"refused"`
	// Quarantined is how many state directories were moved to
	// <state-dir>/quarantine/ (unreadable or refused); no later start
	// reads them.
	Quarantined int `json:"quarantined"`
}

// HealthStatus reports the agent's health endpoint (its own netns with a
// responder the agent probes from the host).
// HealthReport answers GET /v1/health: this node's health endpoint and
// every remote node's reachability from this one.
type HealthReport struct {
	Local *HealthStatus `json:"local"`
	// Nodes is the last probe round of each remote node, by name (empty
	// with the health endpoint disabled).
	Nodes []NodeHealth `json:"nodes"`
}

// NodeHealth is one remote node as this agent's probes last saw it.
type NodeHealth struct {
	Name string `json:"name"`
	// State is "ok" (every node address and health endpoint address
	// answered ICMP and HTTP), "degraded" (some did), "unreachable" (none
	// did).
	State string `json:"state"`
	// Since is when State last changed (or the node was first probed).
	Since     time.Time        `json:"since"`
	LastProbe time.Time        `json:"last-probe"`
	Addresses []NodeAddrHealth `json:"addresses"`
	// HealthEndpoint is the node's health endpoint, one entry per
	// address it published (empty: it published none, or they were
	// refused; GET /v1/nodes lists those accepted), as Cilium's
	// health-endpoint column.
	HealthEndpoint []NodeAddrHealth `json:"health-endpoint,omitempty"`
}

// NodeAddrHealth is the probes of one address: an ICMP echo and an HTTP
// GET of the health responder on port 4240, /hello (the node's in its
// host netns, or the health endpoint's in its own).
type NodeAddrHealth struct {
	IP   string      `json:"ip"`
	ICMP ProbeResult `json:"icmp"`
	HTTP ProbeResult `json:"http"`
}

// ProbeResult is one probe: answered (with its round trip) or why not.
type ProbeResult struct {
	OK        bool    `json:"ok"`
	LatencyMS float64 `json:"latency-ms,omitempty"`
	Error     string  `json:"error,omitempty"`
}

type HealthStatus struct {
	// State is "ok" (the last probe was answered), "failing", "starting"
	// or "disabled" (no Linux datapath, or --enable-health=false).
	State string `json:"state"`
	// IP is the health endpoint's IPv4 address (its IPv6 address on a
	// node without IPv4).
	IP string `json:"ip,omitempty"`
	// IPv6 is its IPv6 address on a dual-stack node.
	IPv6 string `json:"ipv6,omitempty"`
	// Endpoint is the health endpoint's ID.
	Endpoint int64 `json:"endpoint,omitempty"`
	// LastProbe is when the agent last probed it.
	LastProbe time.Time `json:"last-probe,omitzero"`
	// Error is why the last probe (or the setup) failed.
	Error string `json:"error,omitempty"`
	// NodesProbed is how many remote nodes the node probes cover;
	// FailingNodes names those not "ok" (GET /v1/health has the details).
	NodesProbed  int      `json:"nodes-probed,omitempty"`
	FailingNodes []string `json:"failing-nodes,omitempty"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	// Code is a stable, machine-readable name (see pkg/agent/api's error codes).
	Code string `json:"code"`
	// Message says what went wrong, naming the offending field when there is one.
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// ClusterIdentityStatus reports the cluster-wide identity store.
type ClusterIdentityStatus struct {
	// Backend is "kubernetes" or "etcd".
	Backend string `json:"backend"`
	// Healthy is false while the store cannot be reached; Since is when
	// that last changed.
	Healthy bool      `json:"healthy"`
	Since   time.Time `json:"since"`
	// Synced is true once the store's identities were listed.
	Synced bool `json:"synced"`
	// Known counts the identities in the store; InUse those endpoints on
	// this node hold.
	Known int `json:"known"`
	InUse int `json:"in-use"`
	// Waiting counts label sets waiting for the store; WaitingLabels
	// names some of them.
	Waiting       int      `json:"waiting"`
	WaitingLabels []string `json:"waiting-labels,omitempty"`
	// LastError is the store's or the identity actor's latest failure.
	LastError string `json:"last-error,omitempty"`
}

// AttachRequest is the body of POST /v1/attach: a CNI ADD carried out by
// the agent. It allocates an address of every family it serves, creates
// the veth (host end ContainerID's lxc<hash>, peer ContainerInterfaceName
// created in the netns Netns), configures the pod's side and creates the
// endpoint, answering once its first regeneration is done; on any failure
// it undoes all of it.
type AttachRequest struct {
	ContainerID            string `json:"container-id"`
	ContainerInterfaceName string `json:"container-interface-name"`
	// Netns is the path of the pod's network namespace (CNI_NETNS).
	Netns string `json:"netns"`
	// MTU of both ends of the veth; 0 is 1500.
	MTU          int64  `json:"mtu,omitempty"`
	K8sNamespace string `json:"k8s-namespace,omitempty"`
	K8sPodName   string `json:"k8s-pod-name,omitempty"`
	K8sUID       string `json:"k8s-uid,omitempty"`
	// Labels are source-prefixed labels of the endpoint (at least one).
	Labels []string `json:"labels,omitempty"`
	// NamedPorts are the pod's named container ports (as in
	// EndpointChangeRequest).
	NamedPorts []NamedPort `json:"named-ports,omitempty"`
	// Owner is recorded with the addresses (as POST /v1/ipam's owner).
	Owner string `json:"owner,omitempty"`
	// Chained, when set, adopts the veth and the addresses a previous
	// CNI plugin made (chaining, generic veth) instead of making them:
	// no address is allocated, no interface created; MTU is unused.
	Chained *AttachChained `json:"chained,omitempty"`
	// PortMappings are the pod's hostPorts (the CNI portMappings
	// capability), translated in BPF with kube-proxy replacement.
	PortMappings []PortMapping `json:"port-mappings,omitempty"`
}

// PortMapping is one hostPort: connections to host-ip (every node
// address when empty) on host-port reach container-port of the pod.
// Protocol is "tcp" or "udp" ("sctp" is refused: not translated).
type PortMapping struct {
	HostPort      int64  `json:"host-port"`
	ContainerPort int64  `json:"container-port"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"host-ip,omitempty"`
}

// AttachChained is the attachment a previous plugin made: its host
// interface (the veth's host end, checked to be the peer of
// container-interface-name in netns; when neither name nor index is
// given, that peer) and the pod's addresses (at most one per family,
// each on that interface).
type AttachChained struct {
	HostInterface string `json:"host-interface,omitempty"`
	HostIndex     int64  `json:"host-index,omitempty"`
	IPv4          string `json:"ipv4,omitempty"`
	IPv6          string `json:"ipv6,omitempty"`
}

// AttachResponse is POST /v1/attach's answer (201).
type AttachResponse struct {
	EndpointID    int64           `json:"endpoint-id"`
	HostInterface AttachInterface `json:"host-interface"`
	PodInterface  AttachInterface `json:"pod-interface"`
	// IPv4 and IPv6 are the pod's addresses; at least one is set.
	IPv4 *AttachAddress `json:"ipv4,omitempty"`
	IPv6 *AttachAddress `json:"ipv6,omitempty"`
	// RouteMTU is the MTU the pod's routes carry (the tunnel's in tunnel
	// mode when below the veth's; 0 from an older agent: none).
	RouteMTU int64 `json:"route-mtu,omitempty"`
}

// AttachInterface is one end of the veth.
type AttachInterface struct {
	Name  string `json:"name"`
	Index int64  `json:"index"`
	Mac   string `json:"mac"`
}

// AttachAddress is one of the pod's addresses and its gateway.
type AttachAddress struct {
	IP      string `json:"ip"`
	Gateway string `json:"gateway"`
}
