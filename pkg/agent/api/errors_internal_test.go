package api

import (
	"fmt"
	"net/http"
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
