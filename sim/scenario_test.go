package sim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(tb testing.TB, name, content string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func TestLoadScenario(t *testing.T) {
	tests := []struct {
		name    string
		content string
		wantErr string // substring; "" for success
		check   func(t *testing.T, sc Scenario)
	}{
		{name: "overlays defaults", content: `{"name": "x", "endpoints": 42, "duration": "2s", "faults": {"datapath_error_rate": 0.5}}`,
			check: func(t *testing.T, sc Scenario) {
				d := Defaults()
				if sc.Endpoints != 42 || sc.Duration.D() != 2*time.Second || sc.Faults.DatapathErrorRate != 0.5 {
					t.Errorf("file values not applied: %+v", sc)
				}
				if sc.Workers != d.Workers || sc.Faults.ClientTimeout != d.Faults.ClientTimeout {
					t.Errorf("defaults not kept: workers %d, client timeout %s", sc.Workers, sc.Faults.ClientTimeout.D())
				}
			}},
		{name: "unknown field", content: `{"endpionts": 5}`, wantErr: `unknown field "endpionts"`},
		{name: "bad duration", content: `{"duration": "soon"}`, wantErr: "duration"},
		{name: "duration as number", content: `{"duration": 30}`, wantErr: "duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc, err := LoadScenario(writeFile(t, "sc.json", tt.content))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("LoadScenario = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, sc)
		})
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Scenario)
		want   string // substring naming the field; "" for valid
		is     error
	}{
		{name: "defaults", change: func(*Scenario) {}},
		{name: "no endpoints", change: func(s *Scenario) { s.Endpoints = 0 }, want: "--endpoints", is: ErrInvalidScenario},
		{name: "too many endpoints", change: func(s *Scenario) { s.Endpoints = 60000 }, want: "--endpoints", is: ErrInvalidScenario},
		{name: "no workers", change: func(s *Scenario) { s.Workers = 0 }, want: "--workers", is: ErrInvalidScenario},
		{name: "fault rate above 1", change: func(s *Scenario) { s.Faults.DatapathErrorRate = 1.5 }, want: "datapath_error_rate", is: ErrInvalidScenario},
		{name: "negative label churn", change: func(s *Scenario) { s.LabelChurn = -0.1 }, want: "--label-churn", is: ErrInvalidScenario},
		{name: "client timeouts without a timeout", change: func(s *Scenario) {
			s.Faults.ClientTimeoutRate, s.Faults.ClientTimeout = 0.1, 0
		}, want: "client_timeout", is: ErrInvalidScenario},
		{name: "linux, too many endpoints", change: func(s *Scenario) { s.Datapath = "linux" }, want: "--force", is: ErrInvalidScenario},
		{name: "unknown datapath", change: func(s *Scenario) { s.Datapath = "ebpf" }, want: "--datapath", is: ErrInvalidScenario},
		{name: "range too small", change: func(s *Scenario) { s.IPv4Range = "10.0.0.0/24" }, want: "ipv4_range", is: ErrInvalidScenario},
		{name: "range with host bits", change: func(s *Scenario) { s.IPv4Range = "10.0.0.1/16" }, want: "ipv4_range", is: ErrInvalidScenario},
		{name: "range too large", change: func(s *Scenario) { s.IPv4Range = "10.0.0.0/8" }, want: "ipv4_range", is: ErrInvalidScenario},
		{name: "no request timeout", change: func(s *Scenario) { s.APIRequestTimeout = 0 }, want: "api_request_timeout", is: ErrInvalidScenario},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc := Defaults()
			tt.change(&sc)
			err := sc.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, tt.is) {
				t.Fatalf("Validate = %v, want %v naming %q", err, tt.is, tt.want)
			}
		})
	}
}

// TestValidateLinuxHost: a linux scenario within bounds (or forced) is
// valid for root and refused, naming root, otherwise.
func TestValidateLinuxHost(t *testing.T) {
	for _, tc := range []struct {
		endpoints int
		force     bool
	}{{maxLinuxEndpoints, false}, {maxLinuxEndpoints + 1, true}} {
		sc := Defaults()
		sc.Datapath, sc.Endpoints, sc.ForceLinux = "linux", tc.endpoints, tc.force
		err := sc.Validate()
		if os.Geteuid() == 0 && err != nil {
			t.Errorf("Validate as root (%d endpoints, forced %v) = %v", tc.endpoints, tc.force, err)
		}
		if os.Geteuid() != 0 && (!errors.Is(err, ErrLinuxUnavailable) || !strings.Contains(err.Error(), "root")) {
			t.Errorf("Validate without root = %v, want %v naming root", err, ErrLinuxUnavailable)
		}
	}
}

func TestSetFaultRate(t *testing.T) {
	sc := Defaults()
	sc.SetFaultRate(0.2)
	f := sc.Faults
	if f.DatapathErrorRate != 0.2 || f.SlowDatapathRate != 0.2 || f.ProxyAckDropRate != 0.2 || f.ClientTimeoutRate != 0.2 || f.ProxyAcks != 1 {
		t.Fatalf("SetFaultRate(0.2) = %+v", f)
	}
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestShippedScenarios: every file in scenarios/ loads and validates.
func TestShippedScenarios(t *testing.T) {
	files, err := filepath.Glob("scenarios/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios found: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			sc, err := LoadScenario(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.Validate(); err != nil {
				t.Fatal(err)
			}
			if sc.Name == "" || sc.Description == "" {
				t.Errorf("%s: name and description are required", f)
			}
		})
	}
}
