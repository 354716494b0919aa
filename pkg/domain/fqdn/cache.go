package fqdn

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// EndpointID is an endpoint's ID (EndpointID, which this package cannot
// import: the endpoint record carries a policy, and policy imports this).
type EndpointID = uint16

var (
	// ErrLimit is returned by Learn when the endpoint would hold more
	// learned addresses than CacheConfig.MaxIPsPerEndpoint.
	ErrLimit = errors.New("too many learned addresses for the endpoint")
)

// Defaults of CacheConfig.
const (
	// DefaultMaxIPsPerEndpoint bounds the addresses one endpoint holds.
	DefaultMaxIPsPerEndpoint = 1000
	// MinLifetime is the shortest an answer is kept (a TTL of 0 with no
	// minimum TTL): the pod must get to connect after the answer.
	MinLifetime = time.Second
)

// CacheConfig bounds and tunes a Cache.
type CacheConfig struct {
	// MinTTL raises every answer's TTL to at least this (Cilium's
	// --tofqdns-min-ttl; 0: the DNS TTL as answered).
	MinTTL time.Duration
	// MaxIPsPerEndpoint bounds the (name, address) pairs of one
	// endpoint (default DefaultMaxIPsPerEndpoint).
	MaxIPsPerEndpoint int
}

// Cache holds, per endpoint, the names it resolved through the DNS
// proxy with each answered address and its expiry. Names are
// normalized. Not goroutine safe: the policy actor owns it.
type Cache struct {
	cfg CacheConfig
	eps map[EndpointID]*epCache
	// union counts, per name and address, the endpoints holding it.
	union map[string]map[netip.Addr]int
	next  time.Time // the earliest expiry (zero: none)
}

type epCache struct {
	names map[string]map[netip.Addr]time.Time
	n     int // (name, address) pairs
}

// Entry is one learned (endpoint, name, address) with its expiry.
type Entry struct {
	Endpoint EndpointID `json:"endpoint"`
	Name     string     `json:"name"`
	IP       netip.Addr `json:"ip"`
	Expires  time.Time  `json:"expires"`
}

// NewCache returns an empty cache.
func NewCache(cfg CacheConfig) *Cache {
	if cfg.MaxIPsPerEndpoint <= 0 {
		cfg.MaxIPsPerEndpoint = DefaultMaxIPsPerEndpoint
	}
	return &Cache{cfg: cfg, eps: map[EndpointID]*epCache{}, union: map[string]map[netip.Addr]int{}}
}

// Lifetime returns how long an answer with ttl is kept.
func (c *Cache) Lifetime(ttl time.Duration) time.Duration { return c.cfg.Lifetime(ttl) }

// Lifetime returns how long a cache with this configuration keeps an
// answer with ttl: at least MinTTL and MinLifetime.
func (cfg CacheConfig) Lifetime(ttl time.Duration) time.Duration {
	return max(ttl, cfg.MinTTL, MinLifetime)
}

// Learn records that endpoint ep resolved name to ips with ttl at now
// (an address already held gets the later expiry) and reports whether
// the name's addresses over all endpoints (IPs) changed.
//
// Returns ErrLimit (and records nothing) if the endpoint would hold more
// than MaxIPsPerEndpoint pairs.
func (c *Cache) Learn(ep EndpointID, name string, ips []netip.Addr, ttl time.Duration, now time.Time) (bool, error) {
	name = Normalize(name)
	e := c.eps[ep]
	if e == nil {
		e = &epCache{names: map[string]map[netip.Addr]time.Time{}}
	}
	held := e.names[name]
	added := 0
	for _, ip := range ips {
		if _, ok := held[ip.Unmap()]; !ok {
			added++
		}
	}
	if e.n+added > c.cfg.MaxIPsPerEndpoint {
		return false, fmt.Errorf("endpoint %d: %d learned addresses, %d more for %s: %w", ep, e.n, added, name, ErrLimit)
	}
	if len(ips) == 0 {
		return false, nil
	}
	c.eps[ep] = e
	if held == nil {
		held = map[netip.Addr]time.Time{}
		e.names[name] = held
	}
	exp := now.Add(c.Lifetime(ttl))
	changed := false
	for _, ip := range ips {
		ip = ip.Unmap()
		old, ok := held[ip]
		if !ok {
			e.n++
			changed = c.ref(name, ip) || changed
		}
		if !ok || exp.After(old) {
			held[ip] = exp
		}
	}
	if c.next.IsZero() || exp.Before(c.next) {
		c.next = exp
	}
	return changed, nil
}

// ref counts an endpoint holding (name, ip); reports a new address of name.
func (c *Cache) ref(name string, ip netip.Addr) bool {
	u := c.union[name]
	if u == nil {
		u = map[netip.Addr]int{}
		c.union[name] = u
	}
	u[ip]++
	return u[ip] == 1
}

// unref is ref's inverse; reports an address name lost.
func (c *Cache) unref(name string, ip netip.Addr) bool {
	u := c.union[name]
	if u[ip]--; u[ip] > 0 {
		return false
	}
	delete(u, ip)
	if len(u) == 0 {
		delete(c.union, name)
	}
	return true
}

// Expire drops the entries whose expiry is not after now and returns the
// names whose addresses (IPs) changed, sorted.
func (c *Cache) Expire(now time.Time) []string {
	if c.next.IsZero() || c.next.After(now) {
		return nil
	}
	changed := map[string]struct{}{}
	c.next = time.Time{}
	for id, e := range c.eps {
		for name, held := range e.names {
			for ip, exp := range held {
				if exp.After(now) {
					if c.next.IsZero() || exp.Before(c.next) {
						c.next = exp
					}
					continue
				}
				delete(held, ip)
				e.n--
				if c.unref(name, ip) {
					changed[name] = struct{}{}
				}
			}
			if len(held) == 0 {
				delete(e.names, name)
			}
		}
		if len(e.names) == 0 {
			delete(c.eps, id)
		}
	}
	return slices.Sorted(maps.Keys(changed))
}

// Forget drops endpoint ep's entries (the endpoint is gone) and returns
// the names whose addresses changed, sorted.
func (c *Cache) Forget(ep EndpointID) []string {
	e := c.eps[ep]
	if e == nil {
		return nil
	}
	delete(c.eps, ep)
	var changed []string
	for name, held := range e.names {
		lost := false
		for ip := range held {
			lost = c.unref(name, ip) || lost
		}
		if lost {
			changed = append(changed, name)
		}
	}
	slices.Sort(changed)
	return changed
}

// IPs returns the addresses of name over all endpoints, sorted.
func (c *Cache) IPs(name string) []netip.Addr {
	return slices.SortedFunc(maps.Keys(c.union[Normalize(name)]), netip.Addr.Compare)
}

// Names returns every name with addresses, sorted.
func (c *Cache) Names() []string { return slices.Sorted(maps.Keys(c.union)) }

// Next returns the earliest expiry (false: nothing to expire).
func (c *Cache) Next() (time.Time, bool) { return c.next, !c.next.IsZero() }

// Len returns the number of (endpoint, name, address) entries.
func (c *Cache) Len() int {
	n := 0
	for _, e := range c.eps {
		n += e.n
	}
	return n
}

// Entries returns every entry, ordered by endpoint, name, then address;
// matching (if not nil) keeps the names it accepts.
func (c *Cache) Entries(matching func(name string) bool) []Entry {
	var out []Entry
	for id, e := range c.eps {
		for name, held := range e.names {
			if matching != nil && !matching(name) {
				continue
			}
			for ip, exp := range held {
				out = append(out, Entry{Endpoint: id, Name: name, IP: ip, Expires: exp})
			}
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), strings.Compare(a.Name, b.Name), a.IP.Compare(b.IP))
	})
	return out
}

// Restore adds entries (a previous agent's cache, TTLs as absolute
// expiries) whose expiry is after now, as Learn would with their
// remaining lifetime; an entry that would take its endpoint past
// MaxIPsPerEndpoint, or names no valid address, is skipped. It returns
// the names whose addresses (IPs) changed, sorted.
func (c *Cache) Restore(entries []Entry, now time.Time) []string {
	changed := map[string]struct{}{}
	for _, en := range entries {
		if !en.Expires.After(now) || !en.IP.IsValid() || en.Name == "" {
			continue
		}
		name, ip := Normalize(en.Name), en.IP.Unmap()
		e := c.eps[en.Endpoint]
		if e == nil {
			e = &epCache{names: map[string]map[netip.Addr]time.Time{}}
			c.eps[en.Endpoint] = e
		}
		held := e.names[name]
		if held == nil {
			held = map[netip.Addr]time.Time{}
			e.names[name] = held
		}
		old, ok := held[ip]
		if !ok {
			if e.n >= c.cfg.MaxIPsPerEndpoint {
				continue
			}
			e.n++
			if c.ref(name, ip) {
				changed[name] = struct{}{}
			}
		}
		if !ok || en.Expires.After(old) {
			held[ip] = en.Expires
		}
		if c.next.IsZero() || en.Expires.Before(c.next) {
			c.next = en.Expires
		}
	}
	for id, e := range c.eps {
		for name, held := range e.names {
			if len(held) == 0 {
				delete(e.names, name)
			}
		}
		if len(e.names) == 0 {
			delete(c.eps, id)
		}
	}
	return slices.Sorted(maps.Keys(changed))
}
