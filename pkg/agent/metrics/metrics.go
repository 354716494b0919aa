package metrics

import (
	"net/http"
	"regexp"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "membrane"

// Sample is what the scrape-time gauges read. The agent fills it from the
// index and the actor registry (reads only; no mailbox is involved).
type Sample struct {
	// EndpointsByState counts endpoints per lifecycle state.
	EndpointsByState map[string]int
	// MailboxDepth and MailboxDepthMax are the summed and the largest
	// queue depth per actor kind.
	MailboxDepth, MailboxDepthMax map[string]int64
	// IPAM is the used and free addresses per family ("ipv4", "ipv6").
	IPAM map[string]IPAMSample
	// Identities is the number of allocated (non-reserved) identities.
	Identities int
	// DeleteQueue is the number of queued CNI DELs; negative if unknown
	// (no queue directory configured).
	DeleteQueue int
	// ProxyWaitTimeouts and ProxyRejects count regenerations whose proxy
	// acknowledgement timed out or whose configuration the proxy rejected.
	ProxyWaitTimeouts, ProxyRejects uint64
	// RemoteClaimsRefused counts the other nodes' endpoint claims the
	// agent refused, by source ("k8s", "kvstore") and reason (one of
	// endpoint.Refused*): each object once per reason.
	RemoteClaimsRefused map[string]map[string]uint64
	// RemoteBacklog is, by source ("kvstore"), the other nodes' endpoint
	// changes received and not yet in the ipcache.
	RemoteBacklog map[string]RemoteBacklogSample
	// MapFull counts the writes a full BPF map refused, by map ("policy":
	// regenerations of an endpoint whose policy did not fit its policy
	// maps, each failed closed; "ipcache": entries the ipcache refused).
	MapFull map[string]uint64
	// MapEntries and MapMaxEntries are the fill and the size of the
	// shared BPF maps that fill with load ("ct", "ipcache").
	MapEntries, MapMaxEntries map[string]int
	// Teardowns is the deferred host veth deletions (Linux datapath only:
	// Teardowns.Max 0 means none).
	Teardowns TeardownSample
}

// TeardownSample is the deferred host veth deletions: Pending waiting,
// at most Max; Sync deleted at once because Max were pending.
type TeardownSample struct {
	Pending, Max int
	Sync         uint64
}

// RemoteBacklogSample is one source's queue of remote endpoint changes:
// Pending addresses wait, the oldest for BehindSeconds; Coalesced counts
// changes replaced by a later one to the same address while queued.
type RemoteBacklogSample struct {
	Pending       int
	BehindSeconds float64
	Coalesced     uint64
}

// IPAMSample is one family's pool usage.
type IPAMSample struct{ Used, Free int }

// Metrics holds the agent's collectors. Safe for concurrent use.
type Metrics struct {
	reg        *prometheus.Registry
	apiLatency *prometheus.HistogramVec
	regen      *prometheus.HistogramVec
	dpPhase    *prometheus.HistogramVec
	restore    prometheus.Gauge
	restored   *prometheus.GaugeVec
	drops      *prometheus.CounterVec
	l7         *prometheus.CounterVec
	nodeUp     *prometheus.GaugeVec
	nodeRTT    *prometheus.GaugeVec
	stateOK    prometheus.Gauge
	stateFault *prometheus.CounterVec
	pinRepair  *prometheus.CounterVec
	repinned   prometheus.Counter
	sampler    atomic.Pointer[func() Sample]

	endpoints   *prometheus.Desc
	mailbox     *prometheus.Desc
	mailboxMax  *prometheus.Desc
	ipamUsed    *prometheus.Desc
	ipamFree    *prometheus.Desc
	identities  *prometheus.Desc
	deleteQueue *prometheus.Desc
	proxyWaits  *prometheus.Desc
	refused     *prometheus.Desc
	rbPending   *prometheus.Desc
	rbBehind    *prometheus.Desc
	rbCoalesced *prometheus.Desc
	mapFull     *prometheus.Desc
	tdPending   *prometheus.Desc
	tdMax       *prometheus.Desc
	tdSync      *prometheus.Desc
	mapEntries  *prometheus.Desc
	mapMax      *prometheus.Desc
	dns         *dnsMetrics
	flows       *flowMetrics
}

// New creates the metrics on a fresh registry, with the Go runtime and
// process collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), dns: newDNSMetrics(), flows: newFlowMetrics()}
	m.reg.MustRegister(m.dns.collectors()...)
	m.reg.MustRegister(m.flows.collectors()...)
	m.apiLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "api", Name: "request_duration_seconds",
		Help:    "REST API request latency by route pattern, method and status code.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"route", "method", "code"})
	m.regen = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "endpoint", Name: "regeneration_duration_seconds",
		Help:    "Duration of successful endpoint regenerations by phase (write-state, realize, proxy-wait, total).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"phase"})
	m.dpPhase = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Subsystem: "datapath", Name: "phase_duration_seconds",
		Help: "Duration of the Linux datapath's steps of an endpoint's realise and removal by phase " +
			"(bpf-prepare, realize, host-setup, host-sysctls, bpf-claim, bpf-maps, bpf-policy, bpf-load, bpf-attach, remove).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"phase"})
	m.restore = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "restore_duration_seconds",
		Help: "How long the last restore at agent start took until every restored endpoint held its leases.",
	})
	m.restored = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "restore_endpoints",
		Help: "What the last restore at agent start did with the endpoint state it found, by result " +
			"(found, restored, invalid, refused, quarantined: moved to <state-dir>/quarantine/, never read again).",
	}, []string{"result"})
	m.drops = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "datapath", Name: "drop_notifications_total",
		Help: "Drop notifications received from the endpoint programs by reason and direction " +
			"(the kernel discards notifications while the ring buffer is full; the per-endpoint counters of " +
			"GET /v1/endpoint/{id}/policy count every drop).",
	}, []string{"reason", "direction"})
	m.l7 = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "l7", Name: "requests_total",
		Help: "Requests the L7 proxy decided, by protocol, verdict (allowed, denied) and the direction of the rules " +
			"that decided (ingress, egress; none when no rule applied).",
	}, []string{"protocol", "verdict", "direction"})
	m.nodeUp = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "node_health", Name: "reachable",
		Help: "Whether the last probe of a remote node answered (1) or not (0), by node and probe (icmp: echo to each " +
			"node address; http: the node's health responder on port 4240; health-icmp, health-http: the same to each address " +
			"of the node's health endpoint; a node with several addresses is 1 only if all answered).",
	}, []string{"node", "probe"})
	m.nodeRTT = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "node_health", Name: "latency_seconds",
		Help: "Round trip of the last answered probe of a remote node, by node and probe.",
	}, []string{"node", "probe"})
	m.stateOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "state_dir", Name: "healthy",
		Help: "Whether the state directory takes writes (1) or not (0: full, read-only or failing I/O; new endpoints " +
			"and state changes are refused until a probe succeeds).",
	})
	m.stateOK.Set(1)
	m.stateFault = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "state_dir", Name: "faults_total",
		Help: "Times the state directory turned unhealthy, by cause (read-only, disk-full, io-error, failing).",
	}, []string{"cause"})
	m.pinRepair = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "datapath", Name: "pin_repairs_total",
		Help: "Checks of the BPF pins that found pins removed under the agent, by result (repaired: all pinned again; failed).",
	}, []string{"result"})
	m.repinned = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "datapath", Name: "pins_repinned_total",
		Help: "BPF objects pinned again after their pins were removed under the agent.",
	})
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
	}
	m.endpoints = desc("endpoints", "Endpoints by lifecycle state.", "state")
	m.mailbox = desc("actor_mailbox_depth", "Messages waiting in actor mailboxes, summed per actor kind.", "kind")
	m.mailboxMax = desc("actor_mailbox_depth_max", "The deepest actor mailbox of each kind.", "kind")
	m.ipamUsed = desc("ipam_used_addresses", "Allocated addresses per family.", "family")
	m.ipamFree = desc("ipam_free_addresses", "Free addresses per family.", "family")
	m.identities = desc("identities", "Allocated security identities (reserved ones excluded).")
	m.deleteQueue = desc("cni_delete_queue_length", "CNI DELs queued on disk while the agent was unreachable, not yet drained.")
	m.proxyWaits = desc("proxy_wait_failures_total", "Regenerations whose proxy wait failed, by result "+
		"(timeout: no acknowledgement in time, the endpoint became ready without it; rejected: the proxy NACKed the configuration).", "result")
	m.refused = desc("remote_claims_refused_total", "Other nodes' endpoint claims refused (not entered into the ipcache), "+
		"by source (k8s, kvstore) and reason (no-owner, unknown-node, outside-node-cidrs, foreign-node-ip, reserved-identity; "+
		"health-outside-node-cidrs: a node's health endpoint address outside its pod CIDRs); each object counts once per reason.", "source", "reason")
	m.rbPending = desc("remote_updates_pending", "Other nodes' endpoint changes received and not yet in the ipcache, by source (kvstore): "+
		"addresses whose latest change waits (a later change to an address replaces the earlier one).", "source")
	m.rbBehind = desc("remote_updates_behind_seconds", "Age of the oldest of membrane_remote_updates_pending, by source: how far "+
		"this node's ipcache is behind the cluster (0: caught up). GET /v1/status says behind from 5 s.", "source")
	m.rbCoalesced = desc("remote_updates_coalesced_total", "Other nodes' endpoint changes replaced by a later change to the same address "+
		"before the ipcache took them, by source: work saved while behind.", "source")
	m.mapFull = desc("bpf_map_full_total", "Writes a full BPF map refused, by map (policy: regenerations of an endpoint "+
		"whose policy did not fit its policy maps, --policy-map-max; the endpoint denies every new connection until it fits; "+
		"ipcache: entries the ipcache refused, --ipcache-max).", "map")
	m.mapEntries = desc("bpf_map_entries", "Entries of the shared BPF maps that fill with load, read at the scrape, "+
		"by map (ct: conntrack, an LRU that evicts the least recently used connection when full; ipcache: refuses new entries when full).", "map")
	m.tdPending = desc("veth_teardowns_pending", "Deleted endpoints' host veths, down and renamed to their tombstone (lxc-<index>), "+
		"whose deferred deletion has not run yet.")
	m.tdMax = desc("veth_teardowns_pending_max", "The bound of membrane_veth_teardowns_pending (--teardown-max-pending).")
	m.tdSync = desc("veth_teardowns_sync_total", "Host veths deleted on the CNI DEL's path because --teardown-max-pending deletions were pending.")
	m.mapMax = desc("bpf_map_max_entries", "The size of the maps of membrane_bpf_map_entries (--ct-max, --ipcache-max).", "map")
	m.reg.MustRegister(m.apiLatency, m.regen, m.dpPhase, m.restore, m.restored, m.drops, m.l7, m.nodeUp, m.nodeRTT, m.stateOK, m.stateFault, m.pinRepair, m.repinned, (*sampled)(m),
		// Besides the defaults: go_gc_heap_live_bytes, the heap the last
		// collection kept (what --memory-limit-mib's floor follows), and
		// go_cpu_classes_gc_total_cpu_seconds_total, the collector's CPU
		// time (what the limit costs).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.GoRuntimeMetricsRule{Matcher: liveHeapMetric})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

var liveHeapMetric = regexp.MustCompile(`^(/gc/heap/live:bytes|/cpu/classes/gc/total:cpu-seconds)$`)

// NodeProbe records a probe round of a remote node (health's node
// prober): ok if every address answered, rtt the slowest answer.
func (m *Metrics) NodeProbe(node, probe string, ok bool, rtt time.Duration) {
	v := 0.0
	if ok {
		v = 1
		m.nodeRTT.WithLabelValues(node, probe).Set(rtt.Seconds())
	}
	m.nodeUp.WithLabelValues(node, probe).Set(v)
}

// ForgetProbes drops a remote node's series of the probes named.
func (m *Metrics) ForgetProbes(node string, probes ...string) {
	for _, p := range probes {
		m.nodeUp.DeleteLabelValues(node, p)
		m.nodeRTT.DeleteLabelValues(node, p)
	}
}

// ForgetNode drops a remote node's probe metrics (it left the cluster).
func (m *Metrics) ForgetNode(node string) {
	m.nodeUp.DeletePartialMatch(prometheus.Labels{"node": node})
	m.nodeRTT.DeletePartialMatch(prometheus.Labels{"node": node})
}

// StateDirHealth records a change of the state directory's health
// (cause: why it is unhealthy, "" when healthy).
func (m *Metrics) StateDirHealth(healthy bool, cause string) {
	if healthy {
		m.stateOK.Set(1)
		return
	}
	m.stateOK.Set(0)
	m.stateFault.WithLabelValues(cause).Inc()
}

// PinRepair records a check that found BPF pins missing and pinned
// repinned of them again (ok: all of them).
func (m *Metrics) PinRepair(ok bool, repinned int) {
	result := "repaired"
	if !ok {
		result = "failed"
	}
	m.pinRepair.WithLabelValues(result).Inc()
	m.repinned.Add(float64(repinned))
}

// SetSampler installs the function the scrape-time gauges read.
func (m *Metrics) SetSampler(f func() Sample) { m.sampler.Store(&f) }

// ObserveRequest records one API request.
func (m *Metrics) ObserveRequest(route, method string, code int, d time.Duration) {
	m.apiLatency.WithLabelValues(route, method, strconv.Itoa(code)).Observe(d.Seconds())
}

// RegenPhase records one regeneration phase (actors.Observer).
func (m *Metrics) RegenPhase(phase string, d time.Duration) {
	m.regen.WithLabelValues(phase).Observe(d.Seconds())
}

// DatapathPhase records one step of the Linux datapath
// (datapath.LinuxHooks.Phase).
func (m *Metrics) DatapathPhase(phase string, d time.Duration) {
	m.dpPhase.WithLabelValues(phase).Observe(d.Seconds())
}

// Gatherer returns the registry, for callers that read the metrics in
// process (benchmarks) instead of scraping Handler.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Drop counts one drop notification. It never blocks on I/O (the
// ring-buffer reader calls it per notification).
func (m *Metrics) Drop(reason, direction string) {
	m.drops.WithLabelValues(reason, direction).Inc()
}

// L7Request counts one request the L7 proxy decided. It never blocks
// on I/O.
func (m *Metrics) L7Request(protocol, verdict, direction string) {
	m.l7.WithLabelValues(protocol, verdict, direction).Inc()
}

// SetRestoreDuration records the last restore's duration.
func (m *Metrics) SetRestoreDuration(d time.Duration) { m.restore.Set(d.Seconds()) }

// SetRestoreCounts records what the last restore did, by result.
func (m *Metrics) SetRestoreCounts(found, restored, invalid, refused, quarantined int) {
	for _, c := range []struct {
		result string
		n      int
	}{{"found", found}, {"restored", restored}, {"invalid", invalid}, {"refused", refused}, {"quarantined", quarantined}} {
		m.restored.WithLabelValues(c.result).Set(float64(c.n))
	}
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Registry is the registry the metrics live in (for tests and extensions).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// sampled is the collector of the scrape-time gauges.
type sampled Metrics

// Describe implements prometheus.Collector.
func (s *sampled) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.endpoints, s.mailbox, s.mailboxMax, s.ipamUsed, s.ipamFree, s.identities, s.deleteQueue, s.proxyWaits, s.refused, s.rbPending, s.rbBehind, s.rbCoalesced, s.mapFull, s.mapEntries, s.mapMax,
		s.tdPending, s.tdMax, s.tdSync} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *sampled) Collect(ch chan<- prometheus.Metric) {
	f := s.sampler.Load()
	if f == nil {
		return
	}
	smp := (*f)()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for state, n := range smp.EndpointsByState {
		gauge(s.endpoints, float64(n), state)
	}
	for kind, n := range smp.MailboxDepth {
		gauge(s.mailbox, float64(n), kind)
	}
	for kind, n := range smp.MailboxDepthMax {
		gauge(s.mailboxMax, float64(n), kind)
	}
	for fam, p := range smp.IPAM {
		gauge(s.ipamUsed, float64(p.Used), fam)
		gauge(s.ipamFree, float64(p.Free), fam)
	}
	gauge(s.identities, float64(smp.Identities))
	if smp.DeleteQueue >= 0 {
		gauge(s.deleteQueue, float64(smp.DeleteQueue))
	}
	if td := smp.Teardowns; td.Max > 0 {
		gauge(s.tdPending, float64(td.Pending))
		gauge(s.tdMax, float64(td.Max))
		ch <- prometheus.MustNewConstMetric(s.tdSync, prometheus.CounterValue, float64(td.Sync))
	}
	ch <- prometheus.MustNewConstMetric(s.proxyWaits, prometheus.CounterValue, float64(smp.ProxyWaitTimeouts), "timeout")
	ch <- prometheus.MustNewConstMetric(s.proxyWaits, prometheus.CounterValue, float64(smp.ProxyRejects), "rejected")
	for name, n := range smp.MapEntries {
		gauge(s.mapEntries, float64(n), name)
	}
	for name, n := range smp.MapMaxEntries {
		gauge(s.mapMax, float64(n), name)
	}
	for name, n := range smp.MapFull {
		ch <- prometheus.MustNewConstMetric(s.mapFull, prometheus.CounterValue, float64(n), name)
	}
	for src, byReason := range smp.RemoteClaimsRefused {
		for reason, n := range byReason {
			ch <- prometheus.MustNewConstMetric(s.refused, prometheus.CounterValue, float64(n), src, reason)
		}
	}
	for src, b := range smp.RemoteBacklog {
		gauge(s.rbPending, float64(b.Pending), src)
		gauge(s.rbBehind, b.BehindSeconds, src)
		ch <- prometheus.MustNewConstMetric(s.rbCoalesced, prometheus.CounterValue, float64(b.Coalesced), src)
	}
}
