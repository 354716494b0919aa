package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/membrane-cni/membrane/pkg/agent"
	"github.com/membrane-cni/membrane/pkg/agent/dnsproxy"
)

// dnsFlags are the DNS proxy's flags (Cilium's names where Cilium has one).
type dnsFlags struct {
	enable                bool
	port                  uint
	rejectCode            string
	minTTL, maxDelay      time.Duration
	maxIPs, maxConcurrent int
}

func addDNSFlags(fs *flag.FlagSet) *dnsFlags {
	d := &dnsFlags{}
	fs.BoolVar(&d.enable, "dns-proxy", false, "linux datapath: run the DNS proxy; enables toFQDNs and toPorts[].rules.dns policy (refused at import without it)")
	fs.UintVar(&d.port, "tofqdns-proxy-port", dnsproxy.DefaultPort, "DNS proxy: port of its transparent UDP and TCP sockets at 127.0.0.1 of the host netns")
	fs.StringVar(&d.rejectCode, "tofqdns-dns-reject-response-code", dnsproxy.RejectRefused, "DNS proxy: answer to a query rules.dns does not allow: refused (REFUSED) or nameError (NXDOMAIN)")
	fs.DurationVar(&d.minTTL, "tofqdns-min-ttl", 0, "minimum time learned DNS addresses stay allowed (0: the answer's TTL, at least 1s)")
	fs.IntVar(&d.maxIPs, "tofqdns-endpoint-max-ips", 1000, "most (name, address) pairs learned per endpoint; an answer beyond it gets SERVFAIL")
	fs.IntVar(&d.maxConcurrent, "dnsproxy-concurrency-limit", dnsproxy.DefaultMaxConcurrent, "DNS proxy: most queries in flight (more UDP queries are dropped, TCP connections closed)")
	fs.DurationVar(&d.maxDelay, "tofqdns-proxy-response-max-delay", time.Second, "DNS proxy: longest an allowed answer is held until its addresses are realised; then it is released anyway (counted)")
	return d
}

// apply fills cfg from the flags.
func (d *dnsFlags) apply(cfg *agent.Config) error {
	cfg.FQDN.MinTTL, cfg.FQDN.MaxIPsPerEndpoint = d.minTTL, d.maxIPs
	if !d.enable {
		return nil
	}
	if d.port == 0 || d.port > 65535 {
		return fmt.Errorf("--tofqdns-proxy-port: %d: want 1..65535", d.port)
	}
	if d.maxConcurrent <= 0 || d.maxDelay <= 0 || d.maxIPs <= 0 {
		return fmt.Errorf("--dnsproxy-concurrency-limit, --tofqdns-proxy-response-max-delay, --tofqdns-endpoint-max-ips: want positive values")
	}
	cfg.DNSProxy = &dnsproxy.Config{Port: uint16(d.port), RejectCode: d.rejectCode, MaxConcurrent: d.maxConcurrent, HoldTimeout: d.maxDelay}
	return nil
}
