package main

import (
	"testing"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestHealthText(t *testing.T) {
	tests := []struct {
		name string
		h    models.HealthStatus
		want string
	}{
		{"dual-stack", models.HealthStatus{State: "ok", IP: "10.0.0.2", IPv6: "fd00::2", Endpoint: 7}, "ok (10.0.0.2 fd00::2, endpoint 7)"},
		{"ipv6-only", models.HealthStatus{State: "ok", IP: "fd00::2", Endpoint: 7}, "ok (fd00::2, endpoint 7)"},
		{"failing", models.HealthStatus{State: "failing", IP: "10.0.0.2", Endpoint: 7, Error: "timeout"}, "failing (10.0.0.2, endpoint 7): timeout"},
		{"disabled", models.HealthStatus{State: "disabled"}, "disabled"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := healthText(&tt.h); got != tt.want {
				t.Fatalf("healthText = %q, want %q", got, tt.want)
			}
		})
	}
}
