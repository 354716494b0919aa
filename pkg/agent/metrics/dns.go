package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// dnsMetrics are the DNS proxy's collectors.
type dnsMetrics struct {
	queries *prometheus.CounterVec
	hold    prometheus.Histogram
}

func newDNSMetrics() *dnsMetrics {
	return &dnsMetrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "dns_proxy", Name: "queries_total",
			Help: "DNS queries the DNS proxy handled, by verdict (allowed: answered; denied: refused by rules.dns; " +
				"error: the server failed or the answer could not be realised; dropped: over the concurrency limit; " +
				"hold-timeout: an allowed answer released before its addresses were realised).",
		}, []string{"verdict"}),
		hold: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: "dns_proxy", Name: "hold_duration_seconds",
			Help:    "How long an allowed DNS answer was held until its addresses were in the ipcache and the endpoint's policy map.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
	}
}

func (d *dnsMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{d.queries, d.hold}
}

// DNSQuery counts a query of the DNS proxy by verdict.
func (m *Metrics) DNSQuery(verdict string) { m.dns.queries.WithLabelValues(verdict).Inc() }

// DNSHold records how long an allowed answer was held.
func (m *Metrics) DNSHold(d time.Duration) { m.dns.hold.Observe(d.Seconds()) }
