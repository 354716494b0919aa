package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/actors"
	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// TestAppendActorJSON checks the hand-written encoder against
// encoding/json of models.Actor.
func TestAppendActorJSON(t *testing.T) {
	now := time.Date(2026, 11, 23, 7, 0, 0, 123456789, time.UTC)
	tests := []struct {
		name string
		snap actors.ActorSnapshot
	}{
		{"idle top-level", actors.ActorSnapshot{Path: "agent/ipam", Kind: "ipam", State: "running", Processed: 12}},
		{"reconciler in sync", actors.ActorSnapshot{Path: "agent/nodes", Kind: "nodes", State: "running", Reconciler: &actors.ReconcilerSnapshot{}}},
		{"reconciler retrying", actors.ActorSnapshot{Path: "agent/ipcache", Kind: "ipcache", State: "running",
			Reconciler: &actors.ReconcilerSnapshot{Pending: 7, Failed: 2, Failures: 3, LastError: `ipcache: "10.0.0.1/32" <&>` + "\n"}}},
		{"busy top-level", actors.ActorSnapshot{Path: "agent", Kind: "agent", State: "running", Operation: "*actors.getChildren",
			OperationSince: now.Add(-1500 * time.Millisecond), MailboxDepth: 3, Restarts: 2, LastError: `panic: "boom" <&> ü` + "\n\x01"}},
		{"ready endpoint", actors.ActorSnapshot{Path: "agent/endpoints/ep-7", Kind: "endpoint", State: "ready", StateSince: now.Add(-time.Hour),
			Endpoint: &actors.EndpointActorSnapshot{ID: 7, DesiredRevision: 3, RealizedRevision: 3, RegenerationsRun: 3, RegenerationsCoalesced: 1,
				LastRegeneration: now.Add(-time.Minute), LastPhases: [4]time.Duration{123456, 2 * time.Millisecond, 0, 3*time.Millisecond + 7}}}},
		{"stuck endpoint", actors.ActorSnapshot{Path: "agent/endpoints/ep-65535", Kind: "endpoint", State: "regenerating",
			StateSince: now.Add(-2 * time.Second), Operation: "realize", OperationSince: now.Add(-time.Nanosecond),
			Endpoint: &actors.EndpointActorSnapshot{ID: 65535, DesiredRevision: 1, RegenerationsFailed: 4}}},
		{"waiting endpoint without op", actors.ActorSnapshot{Path: "agent/endpoints/ep-1", Kind: "endpoint", State: "waiting-for-identity",
			StateSince: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600)), Endpoint: &actors.EndpointActorSnapshot{ID: 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := string(appendActorJSON(nil, &tc.snap, now))
			var m models.Actor
			actorModel(&m, &tc.snap, now)
			want, err := json.Marshal(&m)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("hand-encoded\n%s\nencoding/json\n%s", got, want)
			}
		})
	}
}
