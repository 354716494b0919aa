// Package fqdn owns DNS-aware policy's pure parts: the toFQDNs and
// rules.dns name selectors (matchName, matchPattern) with Cilium's
// semantics, and the cache of names learned from DNS answers per
// endpoint, with their addresses and expiry (the DNS TTL, raised to a
// minimum). The policy repository selects the addresses a name selector
// matches; the DNS proxy and the policy actor fill and expire the cache,
// which persists as a File (fqdn.json) and comes back with Restore.
package fqdn
