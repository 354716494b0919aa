package flows

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// TestLearnedNames: answers name their addresses until they expire (at
// least fqdn.MinLifetime, at least the min TTL); the table is bounded.
func TestLearnedNames(t *testing.T) {
	now := time.Unix(1e9, 0)
	l := learnedNames{cfg: fqdn.CacheConfig{MinTTL: 10 * time.Second}}
	ip := netip.MustParseAddr("192.0.2.7")
	l.learn("API.example.com", []string{"192.0.2.7", "bad"}, 2*time.Second, now)
	l.learn("www.example.com.", []string{"::ffff:192.0.2.7"}, 60*time.Second, now)
	if got := l.namesOf(ip, now.Add(5*time.Second)); !slices.Equal(got, []string{"api.example.com.", "www.example.com."}) {
		t.Errorf("names after 5 s = %v, want both (min TTL 10 s)", got)
	}
	if got := l.namesOf(ip, now.Add(30*time.Second)); !slices.Equal(got, []string{"www.example.com."}) {
		t.Errorf("names after 30 s = %v, want the 60 s one", got)
	}
	if got := l.namesOf(netip.MustParseAddr("192.0.2.8"), now); got != nil {
		t.Errorf("unknown address: %v", got)
	}
	for i := range maxLearned + 10 {
		l.learn("n.test", []string{fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}, time.Second, now.Add(time.Minute))
	}
	if n := len(l.addrs); n > maxLearned {
		t.Errorf("%d addresses held, want at most %d", n, maxLearned)
	}
	// Once those expire, a new address is taken again.
	later := now.Add(time.Hour)
	l.learn("late.test", []string{"198.51.100.1"}, time.Second, later)
	if got := l.namesOf(netip.MustParseAddr("198.51.100.1"), later); !slices.Equal(got, []string{"late.test."}) {
		t.Errorf("after expiry a new address got %v", got)
	}
}
