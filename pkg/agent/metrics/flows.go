package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// MaxFlowNamespacePairs caps the (source, destination) namespace pairs
// membrane_flows_namespace_pairs_total keeps series for: the pairs of a
// cluster with many namespaces grow with their square. Flows of a pair
// beyond the cap count in membrane_flows_namespace_pairs_overflow_total.
const MaxFlowNamespacePairs = 1000

// flowMetrics are the flow log's collectors.
type flowMetrics struct {
	byVerdict *prometheus.CounterVec
	pairs     *prometheus.CounterVec
	overflow  prometheus.Counter

	// mu guards seen, the pairs with a series.
	mu   sync.Mutex
	seen map[[2]string]struct{}
}

func newFlowMetrics() *flowMetrics {
	return &flowMetrics{
		byVerdict: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "flows", Name: "total",
			Help: "Flows recorded in the flow log (GET /v1/flows) by type (l3-l4, l7, dns), verdict (forwarded, redirected, " +
				"dropped, audit; allowed, denied, error for l7 and dns) and drop reason (empty unless dropped or audit).",
		}, []string{"type", "verdict", "reason"}),
		pairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "flows", Name: "namespace_pairs_total",
			Help: "Flows by source and destination namespace (empty: not a pod), for at most 1000 pairs " +
				"(then membrane_flows_namespace_pairs_overflow_total).",
		}, []string{"source", "destination"}),
		overflow: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "flows", Name: "namespace_pairs_overflow_total",
			Help: "Flows of namespace pairs beyond the 1000 membrane_flows_namespace_pairs_total keeps series for.",
		}),
		seen: map[[2]string]struct{}{},
	}
}

func (f *flowMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.byVerdict, f.pairs, f.overflow}
}

// Flow counts one flow of the flow log by type, verdict and drop reason,
// and by its namespace pair while fewer than MaxFlowNamespacePairs pairs
// have a series. It never blocks on I/O.
func (m *Metrics) Flow(typ, verdict, reason, srcNamespace, dstNamespace string) {
	f := m.flows
	f.byVerdict.WithLabelValues(typ, verdict, reason).Inc()
	pair := [2]string{srcNamespace, dstNamespace}
	f.mu.Lock()
	_, ok := f.seen[pair]
	if !ok && len(f.seen) < MaxFlowNamespacePairs {
		f.seen[pair], ok = struct{}{}, true
	}
	f.mu.Unlock()
	if !ok {
		f.overflow.Inc()
		return
	}
	f.pairs.WithLabelValues(srcNamespace, dstNamespace).Inc()
}
