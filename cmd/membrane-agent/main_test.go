package main

import (
	"io"
	"strings"
	"testing"
)

func TestFlags(t *testing.T) {
	base := []string{"--socket", "/tmp/x.sock", "--state-dir", "/tmp/x", "--datapath", "fake"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(t *testing.T, addr string, pprof bool)
	}{
		{name: "defaults: loopback listener, no pprof", check: func(t *testing.T, addr string, pprof bool) {
			if addr != "127.0.0.1:9890" || pprof {
				t.Errorf("http-addr %q pprof %v", addr, pprof)
			}
		}},
		{name: "disabled", args: []string{"--http-addr", ""}, check: func(t *testing.T, addr string, _ bool) {
			if addr != "" {
				t.Errorf("http-addr %q", addr)
			}
		}},
		{name: "explicit with pprof", args: []string{"--http-addr", "0.0.0.0:9999", "--pprof"}, check: func(t *testing.T, addr string, pprof bool) {
			if addr != "0.0.0.0:9999" || !pprof {
				t.Errorf("http-addr %q pprof %v", addr, pprof)
			}
		}},
		{name: "bad address", args: []string{"--http-addr", "9890"}, wantErr: "--http-addr"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseFlags(append(append([]string{}, base...), tc.args...), io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, cfg.HTTPAddr, cfg.API.Pprof)
		})
	}
}
