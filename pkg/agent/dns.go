package agent

import (
	"context"
	"fmt"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/agent/dnsproxy"
)

// validateDNS checks the DNS proxy flags.
func (c *Config) validateDNS() error {
	if c.FQDN.MinTTL < 0 || c.FQDN.MaxIPsPerEndpoint < 0 {
		return fmt.Errorf("--tofqdns-min-ttl, --tofqdns-endpoint-max-ips: negative: %w", ErrInvalidConfig)
	}
	if c.DNSProxy == nil {
		return nil
	}
	if c.Datapath != "linux" {
		return fmt.Errorf("--dns-proxy: needs --datapath linux: %w", ErrInvalidConfig)
	}
	if err := c.DNSProxy.Validate(); err != nil {
		return fmt.Errorf("--dns-proxy: %w: %w", err, ErrInvalidConfig)
	}
	return nil
}

// startDNSProxy opens the DNS proxy's sockets in the host netns and
// serves them until Stop.
func (a *Agent) startDNSProxy(linux *datapath.Linux) error {
	if a.cfg.DNSProxy == nil || linux == nil {
		return nil
	}
	p, err := dnsproxy.New(*a.cfg.DNSProxy, a.Index, a.System, linux, a.events, a.log.With("component", "dns-proxy"))
	if err != nil {
		return err
	}
	p.SetObserver(a.cfg.API.Metrics)
	if err := p.Listen(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := p.Serve(ctx); err != nil {
			a.log.Error("dns proxy stopped", "err", err)
		}
	}()
	a.stopDNS = func() { cancel(); <-done }
	return nil
}
