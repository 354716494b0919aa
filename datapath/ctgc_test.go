package datapath

import (
	"testing"
	"time"
)

func TestNextCTGCInterval(t *testing.T) {
	const minI, maxI = 10 * time.Second, 30 * time.Minute
	tests := []struct {
		name              string
		prev              time.Duration
		deleted, examined int
		want              time.Duration
	}{
		{"nothing examined keeps", time.Minute, 0, 0, time.Minute},
		{"few dead grow by half", time.Minute, 1, 100, 90 * time.Second},
		{"some dead keep", time.Minute, 10, 100, time.Minute},
		{"half dead halve", time.Minute, 50, 100, 30 * time.Second},
		{"all dead: at most 10x shorter", 10 * time.Minute, 100, 100, time.Minute},
		{"not below min", 15 * time.Second, 100, 100, minI},
		{"not above max", 25 * time.Minute, 0, 100, maxI},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := NextCTGCInterval(tt.prev, tt.deleted, tt.examined, minI, maxI); got != tt.want {
				t.Fatalf("NextCTGCInterval(%v, %d/%d) = %v, want %v", tt.prev, tt.deleted, tt.examined, got, tt.want)
			}
		})
	}
}

func TestCTGCConfigValidate(t *testing.T) {
	if err := (CTGCConfig{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if err := (CTGCConfig{Interval: -1}).Validate(); err != nil {
		t.Fatalf("disabled: %v", err)
	}
	for _, c := range []CTGCConfig{
		{Interval: time.Second, MinInterval: time.Minute, MaxInterval: time.Second, Budget: 1},
		{Interval: time.Second, MinInterval: time.Second, MaxInterval: time.Second, Budget: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}
