package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestDNSFlags(t *testing.T) {
	base := []string{"--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"off", []string{"--datapath", "fake", "--tofqdns-min-ttl", "30s"}, ""},
		{"on", []string{"--datapath", "linux", "--dns-proxy", "--tofqdns-proxy-port", "10054", "--tofqdns-dns-reject-response-code", "nameError"}, ""},
		{"fake datapath", []string{"--datapath", "fake", "--dns-proxy"}, "--dns-proxy: needs --datapath linux"},
		{"bad reject code", []string{"--datapath", "linux", "--dns-proxy", "--tofqdns-dns-reject-response-code", "servfail"}, "reject code"},
		{"port 0", []string{"--datapath", "linux", "--dns-proxy", "--tofqdns-proxy-port", "0"}, "--tofqdns-proxy-port"},
		{"port too large", []string{"--datapath", "linux", "--dns-proxy", "--tofqdns-proxy-port", "70000"}, "--tofqdns-proxy-port"},
		{"no delay", []string{"--datapath", "linux", "--dns-proxy", "--tofqdns-proxy-response-max-delay", "0"}, "positive"},
		{"negative min ttl", []string{"--datapath", "fake", "--tofqdns-min-ttl", "-1s"}, "--tofqdns-min-ttl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch tc.name {
			case "off":
				if cfg.DNSProxy != nil || cfg.FQDN.MinTTL != 30*time.Second || cfg.FQDN.MaxIPsPerEndpoint != 1000 {
					t.Fatalf("cfg %+v %+v", cfg.DNSProxy, cfg.FQDN)
				}
			case "on":
				if cfg.DNSProxy == nil || cfg.DNSProxy.Port != 10054 || cfg.DNSProxy.RejectCode != "nameError" || cfg.DNSProxy.HoldTimeout != time.Second {
					t.Fatalf("cfg %+v", cfg.DNSProxy)
				}
			}
		})
	}
}
