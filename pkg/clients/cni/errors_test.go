package cni

import (
	"strings"
	"testing"
)

// TestAgentErrorStateDisk: the agent's refusals for a state directory
// that is full, read-only or failing I/O become CNI code 108, naming the
// cause and carrying the agent's code.
func TestAgentErrorStateDisk(t *testing.T) {
	for _, tc := range []struct{ code, names string }{
		{"state-disk-full", "full (ENOSPC)"},
		{"state-dir-read-only", "read-only (EROFS)"},
		{"state-disk-io-error", "fails I/O (EIO)"},
	} {
		t.Run(tc.code, func(t *testing.T) {
			te := agentError("attach", &apiError{Status: 507, Code: tc.code, Message: "write state: boom"})
			if te.Code != CodeStateDisk || !strings.Contains(te.Msg, tc.names) || !strings.Contains(te.Msg, tc.code) {
				t.Fatalf("agentError = %d %q; want %d naming %q and %q", te.Code, te.Msg, CodeStateDisk, tc.names, tc.code)
			}
		})
	}
}
