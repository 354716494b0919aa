package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/membrane-cni/membrane/actors"
)

// TestClassifyIdentityStoreUnavailable: a new label set that waits for the
// cluster identity store answers 503 with its own code (the plugin retries),
// not 500, however deeply the actors wrapped it.
func TestClassifyIdentityStoreUnavailable(t *testing.T) {
	err := fmt.Errorf("resolve identity: %w", fmt.Errorf("acquire identity for k8s:app=x: %w", actors.ErrIdentityStoreUnavailable))
	if st, code := classify(err); st != http.StatusServiceUnavailable || code != CodeIdentityStore {
		t.Fatalf("classify = %d %s, want 503 %s", st, code, CodeIdentityStore)
	}
}

// TestServiceUnavailableRetryAfter: every 503 says when to retry (a
// client that cannot tell "busy" from "broken" would wait out its own
// deadline instead).
func TestServiceUnavailableRetryAfter(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("acquire identity: %w", actors.ErrIdentityStoreUnavailable),
		&apiError{http.StatusServiceUnavailable, CodeAttachmentBusy, "an earlier attach is in flight"},
		fmt.Errorf("realize: %w", actors.ErrPoolClosed),
	} {
		rec := httptest.NewRecorder()
		writeError(rec, err)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" {
			t.Errorf("%v: %d, Retry-After %q", err, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
	rec := httptest.NewRecorder()
	writeError(rec, fmt.Errorf("boom"))
	if rec.Header().Get("Retry-After") != "" {
		t.Errorf("500 with Retry-After %q", rec.Header().Get("Retry-After"))
	}
}
