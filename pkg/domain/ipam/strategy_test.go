package ipam

import (
	"errors"
	"net/netip"
	"testing"
)

func TestParseStrategy(t *testing.T) {
	tests := []struct {
		in      string
		want    Strategy
		wantErr error
	}{
		{"sequential", Sequential, nil},
		{"random", Random, nil},
		{"", 0, ErrInvalidStrategy},
		{"Random", 0, ErrInvalidStrategy},
		{"round-robin", 0, ErrInvalidStrategy},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseStrategy(tt.in)
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("ParseStrategy(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseStrategy(%q) = %v, want %v", tt.in, got, tt.want)
			}
			if err == nil && got.String() != tt.in {
				t.Errorf("String() = %q, want %q (round trip)", got.String(), tt.in)
			}
		})
	}
}

func TestStrategyString(t *testing.T) {
	tests := []struct {
		s    Strategy
		want string
	}{
		{Sequential, "sequential"},
		{Random, "random"},
		{Strategy(9), "Strategy(9)"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.s.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestPool(t *testing.T) {
	v4 := newTestRange(t, "10.0.0.0/24", Sequential, 0)
	v6 := newTestRange(t, "fd00::/112", Sequential, 0)
	tests := []struct {
		name       string
		pool       *Pool
		want4      *Range
		want6      *Range
		wantFor4   *Range // RangeFor(10.0.0.5)
		wantFor6   *Range // RangeFor(fd00::5)
		wantMapped *Range // RangeFor(::ffff:10.0.0.5)
	}{
		{"dual stack", NewPool(v4, v6), v4, v6, v4, v6, v4},
		{"v4 only", NewPool(v4, nil), v4, nil, v4, nil, v4},
		{"v6 only", NewPool(nil, v6), nil, v6, nil, v6, nil},
		{"empty", NewPool(nil, nil), nil, nil, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.pool.Range(IPv4); got != tt.want4 {
				t.Errorf("Range(IPv4) = %v, want %v", got, tt.want4)
			}
			if got := tt.pool.Range(IPv6); got != tt.want6 {
				t.Errorf("Range(IPv6) = %v, want %v", got, tt.want6)
			}
			if got := tt.pool.Range("ipx"); got != nil {
				t.Errorf("Range(ipx) = %v, want nil", got)
			}
			if got := tt.pool.RangeFor(netip.MustParseAddr("10.0.0.5")); got != tt.wantFor4 {
				t.Errorf("RangeFor(10.0.0.5) = %v, want %v", got, tt.wantFor4)
			}
			if got := tt.pool.RangeFor(netip.MustParseAddr("fd00::5")); got != tt.wantFor6 {
				t.Errorf("RangeFor(fd00::5) = %v, want %v", got, tt.wantFor6)
			}
			if got := tt.pool.RangeFor(netip.MustParseAddr("::ffff:10.0.0.5")); got != tt.wantMapped {
				t.Errorf("RangeFor(::ffff:10.0.0.5) = %v, want %v", got, tt.wantMapped)
			}
			if got := tt.pool.RangeFor(netip.Addr{}); got != nil {
				t.Errorf("RangeFor(invalid) = %v, want nil", got)
			}
		})
	}
}

func TestNewPoolWrongFamilyPanics(t *testing.T) {
	v4 := newTestRange(t, "10.0.0.0/24", Sequential, 0)
	v6 := newTestRange(t, "fd00::/112", Sequential, 0)
	tests := []struct {
		name   string
		v4, v6 *Range
	}{
		{"v6 as v4", v6, nil},
		{"v4 as v6", nil, v4},
		{"swapped", v6, v4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("NewPool did not panic")
				}
			}()
			NewPool(tt.v4, tt.v6)
		})
	}
}
