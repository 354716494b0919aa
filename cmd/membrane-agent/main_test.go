package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseFlagsIPAMExpiry(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    time.Duration // the IPAM config's Expiry
		wantErr string
	}{
		{nil, 10 * time.Minute, ""},
		{[]string{"--ipam-expiry", "90s"}, 90 * time.Second, ""},
		{[]string{"--ipam-expiry", "0"}, -1, ""},
		{[]string{"--ipam-expiry", "500ms"}, 0, "--ipam-expiry"},
		{[]string{"--ipam-expiry", "-1m"}, 0, "--ipam-expiry"},
		{[]string{"--ipam-expiry", "soon"}, 0, "ipam-expiry"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"--datapath", "fake", "--socket", "/tmp/x.sock", "--state-dir", "/tmp/x"}, tc.args...)
			cfg, _, err := parseFlags(args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Actors.IPAM.Expiry != tc.want {
				t.Errorf("expiry %v, want %v", cfg.Actors.IPAM.Expiry, tc.want)
			}
		})
	}
}
