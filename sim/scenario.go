package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/ipam"
)

var (
	// ErrInvalidScenario is wrapped by scenario validation errors, which
	// name the bad field by its JSON name (and flag, when there is one).
	ErrInvalidScenario = errors.New("invalid scenario")
	// ErrLinuxUnavailable is returned for --datapath linux where it cannot
	// run: not root, or not Linux.
	ErrLinuxUnavailable = errors.New("linux datapath not available here")
)

// Duration is a time.Duration written as a string ("30s") in scenario files.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string like \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// Scenario is what one simulation run does. Zero values are filled by
// Defaults; files are read over the defaults (LoadScenario).
type Scenario struct {
	// Name labels the run in reports.
	Name string `json:"name"`
	// Description says what the scenario exercises.
	Description string `json:"description,omitempty"`
	// Endpoints is how many live endpoints the run ramps up to and holds
	// during churn (--endpoints).
	Endpoints int `json:"endpoints"`
	// Duration is the length of the churn phase, after the ramp-up
	// (--duration).
	Duration Duration `json:"duration"`
	// Seed drives every random choice of the harness and of the fake
	// datapath (--seed). Concurrency makes runs similar, not identical.
	Seed uint64 `json:"seed"`
	// Workers is how many kubelet-like clients run concurrently (--workers).
	Workers int `json:"workers"`
	// ArrivalRate bounds pod creations per second during the ramp-up
	// (--arrival-rate; 0: as fast as the agent answers).
	ArrivalRate float64 `json:"arrival_rate"`
	// ChurnRate bounds lifecycles per second during churn; each deletes a
	// random live pod and creates a new one, so deletions match arrivals
	// (--churn-rate; 0: as fast as the agent answers).
	ChurnRate float64 `json:"churn_rate"`
	// Regenerations is how many regenerations each new pod asks for after
	// its ADD (--regenerations).
	Regenerations int `json:"regenerations"`
	// LabelChurn is the probability, per lifecycle, of relabelling a
	// random live pod: new identity and a regeneration (--label-churn).
	LabelChurn float64 `json:"label_churn"`
	// PolicyChurn is the probability, per lifecycle of the churn phase,
	// of a policy change: a CiliumNetworkPolicy or NetworkPolicy selecting
	// the pods' shards imported, replaced or deleted through PUT/DELETE
	// /v1/policy (--policy-churn; see policychurn.go).
	PolicyChurn float64 `json:"policy_churn"`
	// Identities is the number of distinct label sets pods are spread over.
	Identities int `json:"identities"`
	// Crashes is how many agent crash/restarts happen at random moments of
	// the churn phase (--crashes).
	Crashes int `json:"crashes"`
	// CrashDowntime bounds how long the agent stays down per crash; each
	// downtime is drawn uniformly below it.
	CrashDowntime Duration `json:"crash_downtime"`
	// Datapath is "fake" or "linux" (--datapath). linux needs root and
	// runs membrane-cni in a network namespace per pod (linux_linux.go).
	Datapath string `json:"datapath"`
	// ForceLinux lets a linux run exceed maxLinuxEndpoints (--force).
	ForceLinux bool `json:"force_linux,omitempty"`
	// IPv4Range is the agent's pod CIDR.
	IPv4Range string `json:"ipv4_range"`
	// ProxyWaitTimeout is the agent's bound on waiting for proxy
	// acknowledgements (actors.EndpointConfig.ProxyWaitTimeout).
	ProxyWaitTimeout Duration `json:"proxy_wait_timeout"`
	// QuiesceTimeout bounds the wait for the agent to settle after churn
	// and after the final drain.
	QuiesceTimeout Duration `json:"quiesce_timeout"`
	// APIRequestTimeout bounds an API request's wait for the actors
	// (api.Config.RequestTimeout). After a crash, requests whose actor
	// stopped before answering wait this long in the dead agent, and the
	// final goroutine count waits for them.
	APIRequestTimeout Duration `json:"api_request_timeout"`
	// Faults are injected during ramp-up and churn, and switched off for
	// the quiescent checks.
	Faults Faults `json:"faults"`
}

// Faults are the injected faults. Rates are probabilities in 0..1.
type Faults struct {
	// DatapathErrorRate fails Realize and Remove (datapath.FakeHooks.ErrorRate).
	DatapathErrorRate float64 `json:"datapath_error_rate"`
	// DatapathDelay is added to every Realize and Remove.
	DatapathDelay Duration `json:"datapath_delay"`
	// SlowDatapathRate is the share of Realize and Remove calls that take
	// SlowDatapathDelay longer.
	SlowDatapathRate  float64  `json:"slow_datapath_rate"`
	SlowDatapathDelay Duration `json:"slow_datapath_delay"`
	// ProxyAcks is how many proxies acknowledge each revision; they answer
	// after ProxyAckDelay, and each acknowledgement is lost with
	// ProxyAckDropRate (the endpoint then waits for ProxyWaitTimeout).
	ProxyAcks        int      `json:"proxy_acks"`
	ProxyAckDelay    Duration `json:"proxy_ack_delay"`
	ProxyAckDropRate float64  `json:"proxy_ack_drop_rate"`
	// ClientTimeoutRate is the share of pod operations (ADD, DEL,
	// regenerate, relabel) run under a short deadline drawn uniformly
	// below ClientTimeout; an ADD that fails is followed by a DEL, as
	// kubelet does.
	ClientTimeoutRate float64  `json:"client_timeout_rate"`
	ClientTimeout     Duration `json:"client_timeout"`
}

// Defaults returns the default scenario: 10,000 live endpoints, 30 s of
// churn as fast as the agent answers, no faults, no crashes.
func Defaults() Scenario {
	return Scenario{
		Name:              "default",
		Endpoints:         10000,
		Duration:          Duration(30 * time.Second),
		Seed:              1,
		Workers:           64,
		Regenerations:     1,
		LabelChurn:        0.05,
		Identities:        64,
		CrashDowntime:     Duration(100 * time.Millisecond),
		Datapath:          "fake",
		IPv4Range:         "10.200.0.0/16",
		ProxyWaitTimeout:  Duration(200 * time.Millisecond),
		QuiesceTimeout:    Duration(60 * time.Second),
		APIRequestTimeout: Duration(15 * time.Second),
		Faults: Faults{
			SlowDatapathDelay: Duration(50 * time.Millisecond),
			ProxyAckDelay:     Duration(time.Millisecond),
			ClientTimeout:     Duration(20 * time.Millisecond),
		},
	}
}

// SetFaultRate turns every fault on at rate r (--fault-rate): datapath
// errors, slow datapath calls, lost proxy acknowledgements (with one proxy
// per endpoint if none is configured) and client timeouts.
func (s *Scenario) SetFaultRate(r float64) {
	f := &s.Faults
	f.DatapathErrorRate, f.SlowDatapathRate, f.ProxyAckDropRate, f.ClientTimeoutRate = r, r, r, r
	if r > 0 && f.ProxyAcks == 0 {
		f.ProxyAcks = 1
	}
}

// LoadScenario reads a JSON scenario file over Defaults. Unknown fields
// are refused, naming the field.
func LoadScenario(path string) (Scenario, error) {
	sc := Defaults()
	b, err := os.ReadFile(path)
	if err != nil {
		return sc, fmt.Errorf("load scenario: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return sc, fmt.Errorf("load scenario %s: %w", path, err)
	}
	return sc, nil
}

// maxEndpoints keeps the endpoint ID space (1..65535) and a /16 pool
// clear of the pods in flight on top of the live ones.
const maxEndpoints = 50000

// Validate names the bad field (JSON name, with its flag when it has one).
// Returns ErrLinuxUnavailable for datapath "linux" where it cannot run.
func (s *Scenario) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalidScenario)
	}
	switch {
	case s.Endpoints < 1 || s.Endpoints > maxEndpoints:
		return bad("endpoints (--endpoints)", "%d outside 1..%d", s.Endpoints, maxEndpoints)
	case s.Duration < 0:
		return bad("duration (--duration)", "negative")
	case s.Workers < 1 || s.Workers > 4096:
		return bad("workers (--workers)", "%d outside 1..4096", s.Workers)
	case s.ArrivalRate < 0:
		return bad("arrival_rate (--arrival-rate)", "negative")
	case s.ChurnRate < 0:
		return bad("churn_rate (--churn-rate)", "negative")
	case s.Regenerations < 0 || s.Regenerations > 100:
		return bad("regenerations (--regenerations)", "%d outside 0..100", s.Regenerations)
	case s.Identities < 1 || s.Identities > 60000:
		return bad("identities", "%d outside 1..60000", s.Identities)
	case s.Crashes < 0 || s.Crashes > 10000:
		return bad("crashes (--crashes)", "%d outside 0..10000", s.Crashes)
	case s.CrashDowntime < 0 || s.ProxyWaitTimeout < 0 || s.QuiesceTimeout < 0:
		return bad("crash_downtime, proxy_wait_timeout, quiesce_timeout", "negative")
	case s.APIRequestTimeout <= 0:
		return bad("api_request_timeout", "must be positive")
	}
	for name, p := range map[string]float64{"label_churn (--label-churn)": s.LabelChurn, "policy_churn (--policy-churn)": s.PolicyChurn,
		"faults.datapath_error_rate (--fault-rate)": s.Faults.DatapathErrorRate, "faults.slow_datapath_rate (--fault-rate)": s.Faults.SlowDatapathRate,
		"faults.proxy_ack_drop_rate (--fault-rate)": s.Faults.ProxyAckDropRate, "faults.client_timeout_rate (--fault-rate)": s.Faults.ClientTimeoutRate} {
		if p < 0 || p > 1 {
			return bad(name, "%g outside 0..1", p)
		}
	}
	f := s.Faults
	if f.DatapathDelay < 0 || f.SlowDatapathDelay < 0 || f.ProxyAckDelay < 0 || f.ClientTimeout < 0 || f.ProxyAcks < 0 || f.ProxyAcks > 16 {
		return bad("faults", "delays must not be negative and proxy_acks must be within 0..16")
	}
	if f.ClientTimeoutRate > 0 && f.ClientTimeout <= 0 {
		return bad("faults.client_timeout", "must be positive when client_timeout_rate is set")
	}
	switch s.Datapath {
	case "fake":
	case "linux":
		if err := s.validateLinux(); err != nil {
			return err
		}
	default:
		return bad("datapath (--datapath)", "%q: want fake or linux", s.Datapath)
	}
	return s.validateRange()
}

func (s *Scenario) validateRange() error {
	p, err := netip.ParsePrefix(s.IPv4Range)
	if err != nil || !p.Addr().Is4() || p != p.Masked() {
		return fmt.Errorf("ipv4_range: %q is not an IPv4 CIDR without host bits: %w", s.IPv4Range, ErrInvalidScenario)
	}
	if p.Bits() < 12 {
		return fmt.Errorf("ipv4_range: %s: at most a /12 (the harness keeps a table per address): %w", p, ErrInvalidScenario)
	}
	r, err := ipam.NewRange(p, ipam.Sequential, nil)
	if err != nil {
		return fmt.Errorf("ipv4_range: %w", err)
	}
	if need := s.slots(); r.Size() < need {
		return fmt.Errorf("ipv4_range: %s holds %d addresses, the scenario needs %d (endpoints plus pods in flight): %w",
			p, r.Size(), need, ErrInvalidScenario)
	}
	return nil
}

// slots is how many pods can exist at once: the live ones plus, per
// worker, one being added and one being deleted or retried.
func (s *Scenario) slots() int { return s.Endpoints + 2*s.Workers + 16 }
