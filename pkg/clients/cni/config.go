package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
)

// Defaults of the network config keys Membrane adds.
const (
	DefaultSocket         = "/var/run/membrane/membrane.sock"
	DefaultDeleteQueueDir = "/var/run/membrane/delete-queue"
	DefaultMTU            = 1500
	// maxSocketPath is sun_path's size less the terminating NUL.
	maxSocketPath = 107
)

// SupportedVersions are the CNI spec versions membrane-cni speaks.
var SupportedVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// NetConf is membrane-cni's network configuration: the standard keys
// plus socket, mtu and deleteQueueDir. Unknown keys are ignored, as the
// spec asks (runtimes add runtimeConfig, args, capabilities...).
type NetConf struct {
	types.NetConf
	// Socket is the agent's API socket.
	Socket string `json:"socket,omitempty"`
	// MTU of both ends of the veth; 0 means DefaultMTU.
	MTU int `json:"mtu,omitempty"`
	// DeleteQueueDir holds DELs the agent could not take.
	DeleteQueueDir string `json:"deleteQueueDir,omitempty"`
	// AgentTimeout bounds one call's wait for the agent (a Go duration,
	// "1s".."10m"; empty means DefaultAgentTimeout). A stalled agent
	// fails ADD with CodeAgentUnreachable and gets DEL queued after it.
	AgentTimeout string `json:"agentTimeout,omitempty"`
	// timeout is AgentTimeout parsed.
	timeout time.Duration
	// RuntimeConfig holds what the runtime passes for the capabilities
	// the conflist declares: portMappings (the pod's hostPorts).
	RuntimeConfig struct {
		PortMappings []PortMapping `json:"portMappings,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// PortMapping is one entry of the portMappings capability (CNI's
// CONVENTIONS.md): hostPort on hostIP (every node address when empty,
// 0.0.0.0 or ::) to containerPort of the pod.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"`
	HostIP        string `json:"hostIP,omitempty"`
}

// maxPortMappings bounds a pod's port mappings (a pod with more
// hostPorts than this is not a workload the node serves).
const maxPortMappings = 256

// ParseConfig decodes and validates a network config, filling defaults.
// Errors are CNI errors: 6 when the JSON does not decode, 7 naming the
// key when a value is invalid.
func ParseConfig(data []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, decodeError(err)
	}
	if err := conf.validate(); err != nil {
		return nil, err
	}
	return conf, nil
}

func decodeError(err error) *types.Error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("decode network config: key %q: want %s, got JSON %s", typeErr.Field, typeErr.Type, typeErr.Value), "")
	}
	return types.NewError(types.ErrDecodingFailure, "decode network config: "+err.Error(), "")
}

func (c *NetConf) validate() error {
	if c.Name == "" {
		return configError("name", "missing")
	}
	if c.CNIVersion == "" {
		c.CNIVersion = "0.3.1" // the spec's implied version when absent
	}
	if !supported(c.CNIVersion) {
		return types.NewError(types.ErrIncompatibleCNIVersion, fmt.Sprintf("network config key \"cniVersion\": %q not supported (want one of %v)", c.CNIVersion, SupportedVersions), "")
	}
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if !filepath.IsAbs(c.Socket) || len(c.Socket) > maxSocketPath {
		return configError("socket", "%q: want an absolute path of at most %d bytes", c.Socket, maxSocketPath)
	}
	if c.DeleteQueueDir == "" {
		c.DeleteQueueDir = DefaultDeleteQueueDir
	}
	if !filepath.IsAbs(c.DeleteQueueDir) || filepath.Clean(c.DeleteQueueDir) == "/" {
		return configError("deleteQueueDir", "%q: want an absolute path other than /", c.DeleteQueueDir)
	}
	c.timeout = DefaultAgentTimeout
	if c.AgentTimeout != "" {
		d, err := time.ParseDuration(c.AgentTimeout)
		if err != nil || d < time.Second || d > 10*time.Minute {
			return configError("agentTimeout", "%q: want a duration of 1s..10m", c.AgentTimeout)
		}
		c.timeout = d
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 68 || c.MTU > 65535 {
		return configError("mtu", "%d: want 68..65535", c.MTU)
	}
	if c.IPAM.Type != "" {
		return configError("ipam", "membrane-cni allocates addresses from the agent, or adopts a previous plugin's (chained); remove ipam.type %q", c.IPAM.Type)
	}
	return c.validatePortMappings()
}

// validatePortMappings checks runtimeConfig.portMappings: ports 1..65535,
// protocol tcp, udp or sctp (any case; empty is tcp, as the portmap
// plugin reads it), hostIP empty or an address without a zone (0.0.0.0
// and :: meaning every address). Whether the agent can translate them is
// the agent's to say.
func (c *NetConf) validatePortMappings() error {
	pms := c.RuntimeConfig.PortMappings
	if len(pms) > maxPortMappings {
		return configError("runtimeConfig.portMappings", "%d entries, at most %d", len(pms), maxPortMappings)
	}
	for i := range pms {
		pm := &pms[i]
		if pm.HostPort < 1 || pm.HostPort > 65535 || pm.ContainerPort < 1 || pm.ContainerPort > 65535 {
			return configError("runtimeConfig.portMappings", "[%d]: hostPort %d, containerPort %d: want 1..65535", i, pm.HostPort, pm.ContainerPort)
		}
		switch strings.ToLower(pm.Protocol) {
		case "":
			pm.Protocol = "tcp"
		case "tcp", "udp", "sctp":
			pm.Protocol = strings.ToLower(pm.Protocol)
		default:
			return configError("runtimeConfig.portMappings", "[%d]: protocol %q: want tcp, udp or sctp", i, pm.Protocol)
		}
		if pm.HostIP == "" {
			continue
		}
		ip, err := netip.ParseAddr(pm.HostIP)
		if err != nil || ip.Zone() != "" {
			return configError("runtimeConfig.portMappings", "[%d]: hostIP %q: want an IP address", i, pm.HostIP)
		}
		if ip.IsUnspecified() {
			pm.HostIP = ""
		}
	}
	return nil
}

// lenientConfig decodes what it can of a config ParseConfig refused and
// keeps only the keys DEL needs, each valid or its default.
func lenientConfig(data []byte) *NetConf {
	conf := &NetConf{}
	_ = json.Unmarshal(data, conf) // a partial decode is what is wanted here
	if !filepath.IsAbs(conf.Socket) || len(conf.Socket) > maxSocketPath {
		conf.Socket = DefaultSocket
	}
	if !filepath.IsAbs(conf.DeleteQueueDir) || filepath.Clean(conf.DeleteQueueDir) == "/" {
		conf.DeleteQueueDir = DefaultDeleteQueueDir
	}
	conf.timeout = DefaultAgentTimeout
	if d, err := time.ParseDuration(conf.AgentTimeout); err == nil && d >= time.Second && d <= 10*time.Minute {
		conf.timeout = d
	}
	return conf
}

func supported(v string) bool {
	for _, s := range SupportedVersions {
		if v == s {
			return true
		}
	}
	return false
}
