package datapath

import (
	"errors"
	"strings"
	"testing"
)

// TestMapSizes: zero fields take the defaults (Cilium's policy map size),
// sizes outside the bounds are refused naming the field.
func TestMapSizes(t *testing.T) {
	d := (LinuxConfig{}).WithDefaults().Maps
	if d != (MapSizes{PolicyMax: DefaultPolicyMapMax, IPCacheMax: DefaultIPCacheMax, CTMax: DefaultCTMax}) {
		t.Fatalf("defaults %+v", d)
	}
	for _, tc := range []struct {
		m     MapSizes
		field string
	}{
		{MapSizes{PolicyMax: MinPolicyMapMax - 1}, "Maps.PolicyMax"},
		{MapSizes{PolicyMax: MaxPolicyMapMax + 1}, "Maps.PolicyMax"},
		{MapSizes{IPCacheMax: MinIPCacheMax - 1}, "Maps.IPCacheMax"},
		{MapSizes{CTMax: MinCTMax - 1}, "Maps.CTMax"},
		{MapSizes{CTMax: MaxMapEntries + 1}, "Maps.CTMax"},
	} {
		err := tc.m.validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("validate(%+v) = %v, want ErrInvalidConfig naming %s", tc.m, err, tc.field)
		}
	}
	for _, m := range []MapSizes{{}, {PolicyMax: MinPolicyMapMax, IPCacheMax: MinIPCacheMax, CTMax: MinCTMax}, {PolicyMax: MaxPolicyMapMax, IPCacheMax: MaxMapEntries, CTMax: MaxMapEntries}} {
		if err := m.validate(); err != nil {
			t.Errorf("validate(%+v) = %v", m, err)
		}
	}
}
