package flows

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/membrane-cni/membrane/pkg/domain/fqdn"
)

// maxLearned bounds the addresses learnedNames holds; a full table first
// forgets expired names, then refuses new addresses (their flows are
// explained without toFQDNs rules).
const maxLearned = 16384

// learnedNames holds, per address, the DNS names the DNS proxy answered
// with it and when each answer expires: the toFQDNs rules' view of the
// peer (Explain's peerNames). Filled from the proxy's allowed answers;
// an answer lives as long as the policy actor's FQDN cache keeps it
// (fqdn.Cache.Lifetime with Config.FQDNMinTTL).
type learnedNames struct {
	cfg fqdn.CacheConfig // its Lifetime, as the policy actor's cache

	mu    sync.Mutex // guards addrs
	addrs map[netip.Addr]map[string]time.Time
}

// learn records that name resolved to ips with ttl at now.
func (l *learnedNames) learn(name string, ips []string, ttl time.Duration, now time.Time) {
	if name == "" || len(ips) == 0 {
		return
	}
	name = fqdn.Normalize(name)
	expires := now.Add(l.cfg.Lifetime(ttl))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.addrs == nil {
		l.addrs = map[netip.Addr]map[string]time.Time{}
	}
	for _, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		ip = ip.Unmap()
		names, ok := l.addrs[ip]
		if !ok {
			if len(l.addrs) >= maxLearned {
				l.expireLocked(now)
			}
			if len(l.addrs) >= maxLearned {
				continue
			}
			names = map[string]time.Time{}
			l.addrs[ip] = names
		}
		if expires.After(names[name]) {
			names[name] = expires
		}
	}
}

// expireLocked forgets every answer expired at now.
func (l *learnedNames) expireLocked(now time.Time) {
	for ip, names := range l.addrs {
		maps.DeleteFunc(names, func(_ string, exp time.Time) bool { return !exp.After(now) })
		if len(names) == 0 {
			delete(l.addrs, ip)
		}
	}
}

// namesOf returns the names ip was answered for and that are still
// valid at now, sorted (nil: none).
func (l *learnedNames) namesOf(ip netip.Addr, now time.Time) []string {
	if !ip.IsValid() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for name, exp := range l.addrs[ip.Unmap()] {
		if exp.After(now) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// joinNames is names as one comparable key.
func joinNames(names []string) string { return strings.Join(names, " ") }
