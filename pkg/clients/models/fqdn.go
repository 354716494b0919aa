package models

import "time"

// FQDNCacheEntry is one name an endpoint resolved through the DNS proxy
// with one answered address, in GET /v1/fqdn/cache (as Cilium's
// `cilium fqdn cache list`).
type FQDNCacheEntry struct {
	Endpoint uint16 `json:"endpoint"`
	// FQDN is the name, lower-cased with its trailing dot.
	FQDN string `json:"fqdn"`
	IP   string `json:"ip"`
	// ExpirationTime is when the address stops being allowed (the DNS
	// TTL, raised to --tofqdns-min-ttl); TTL is the seconds left.
	ExpirationTime time.Time `json:"expiration-time"`
	TTL            int       `json:"ttl"`
}

// DNSPolicyEntry is a policy entry redirected to the DNS proxy: Names
// are its rules.dns ("name:<n>" or "pattern:<p>", normalized).
type DNSPolicyEntry struct {
	PolicyEntry
	Names []string `json:"names"`
}
