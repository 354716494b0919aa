package sim

import (
	"math"
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// op is an API operation the harness times, or (past numOps) an event
// that only appears in pod histories.
type op uint8

const (
	opIPAMAllocate op = iota
	opPut
	opRegenerate
	opRelabel
	opDelete
	opIPAMRelease
	opList
	// CNI ADD and DEL through membrane-cni (--datapath linux), and policy
	// changes (--policy-churn): see linux_linux.go and policychurn.go.
	opCNIAdd
	opCNIDel
	opPolicyImport
	opPolicyDelete
	numOps

	evLost    // the endpoint was missing after an agent restart
	evSwept   // removed by the quiescence sweep (kubelet/CNI GC)
	evAddFail // the ADD failed; a DEL follows
)

var opNames = [...]string{"ipam_allocate", "endpoint_put", "endpoint_regenerate", "endpoint_relabel",
	"endpoint_delete", "ipam_release", "list",
	"cni_add", "cni_del", "policy_import", "policy_delete", "", "lost_at_restart", "swept", "add_failed"}

func (o op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op?"
}

// Histogram layout: values in microseconds; below 2^subBits one bucket per
// microsecond, above it 2^subBits buckets per power of two (at most 12.5%
// wide), up to 2^40 µs.
const (
	subBits  = 3
	nBuckets = (40-subBits+1)<<subBits + 1<<subBits
)

func bucketOf(us uint64) int {
	if us < 1<<subBits {
		return int(us)
	}
	n := bits.Len64(us)
	shift := n - 1 - subBits
	i := (shift+1)<<subBits + int(us>>shift) - 1<<subBits
	return min(i, nBuckets-1)
}

// bucketLow is the smallest value of bucket i.
func bucketLow(i int) uint64 {
	if i < 1<<subBits {
		return uint64(i)
	}
	shift := i>>subBits - 1
	return uint64(i&(1<<subBits-1)+1<<subBits) << shift
}

// bucketMid is the value a bucket reports: the middle of its range.
func bucketMid(i int) float64 {
	lo, hi := bucketLow(i), bucketLow(i+1)
	if i < 1<<subBits {
		return float64(lo)
	}
	return float64(lo+hi) / 2
}

// histogram counts latencies; safe for concurrent use.
type histogram struct {
	buckets [nBuckets]atomic.Uint64
	count   atomic.Uint64
	sumUS   atomic.Uint64
	maxUS   atomic.Uint64
}

func (h *histogram) observe(d time.Duration) {
	us := uint64(max(d, 0) / time.Microsecond)
	h.buckets[bucketOf(us)].Add(1)
	h.count.Add(1)
	h.sumUS.Add(us)
	for {
		cur := h.maxUS.Load()
		if us <= cur || h.maxUS.CompareAndSwap(cur, us) {
			return
		}
	}
}

// merge adds o's observations to h.
func (h *histogram) merge(o *histogram) {
	for i := range o.buckets {
		h.buckets[i].Add(o.buckets[i].Load())
	}
	h.count.Add(o.count.Load())
	h.sumUS.Add(o.sumUS.Load())
	h.maxUS.Store(max(h.maxUS.Load(), o.maxUS.Load()))
}

// counts copies the buckets (a consistent-enough snapshot for reporting).
func (h *histogram) counts() []uint64 {
	out := make([]uint64, nBuckets)
	for i := range h.buckets {
		out[i] = h.buckets[i].Load()
	}
	return out
}

// quantile returns the q-quantile (0..1) in milliseconds of bucket counts.
func quantile(counts []uint64, q float64) float64 {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range counts {
		seen += c
		if seen >= rank {
			return bucketMid(i) / 1000
		}
	}
	return bucketMid(len(counts)-1) / 1000
}

// recorder times the API operations of a run.
type recorder struct {
	ok [numOps]histogram

	mu   sync.Mutex // guards errs
	errs [numOps]map[string]uint64
}

func newRecorder() *recorder {
	r := &recorder{}
	for i := range r.errs {
		r.errs[i] = make(map[string]uint64)
	}
	return r
}

// observe records one call: its latency if it succeeded, its error class
// otherwise.
func (r *recorder) observe(o op, d time.Duration, err error) {
	if err == nil {
		r.ok[o].observe(d)
		return
	}
	_, code := classify(err)
	r.mu.Lock()
	r.errs[o][code]++
	r.mu.Unlock()
}

// total is the number of calls completed so far (successes and failures).
func (r *recorder) total() uint64 {
	var n uint64
	for i := range r.ok {
		n += r.ok[i].count.Load()
	}
	r.mu.Lock()
	for _, m := range r.errs {
		for _, c := range m {
			n += c
		}
	}
	r.mu.Unlock()
	return n
}

// OpStats summarises one operation in a report.
type OpStats struct {
	Count  uint64            `json:"count"`
	Errors map[string]uint64 `json:"errors,omitempty"`
	P50    float64           `json:"p50"`
	P90    float64           `json:"p90"`
	P99    float64           `json:"p99"`
	P999   float64           `json:"p999"`
	Max    float64           `json:"max"`
	Mean   float64           `json:"mean"`
	// Histogram is the latency distribution of successful calls: bucket
	// lower bounds in ms and counts, empty buckets left out.
	Histogram []HistBucket `json:"histogram,omitempty"`
}

// HistBucket is one non-empty histogram bucket.
type HistBucket struct {
	LowMS float64 `json:"low_ms"`
	Count uint64  `json:"count"`
}

func (r *recorder) stats() map[string]*OpStats {
	out := make(map[string]*OpStats)
	r.mu.Lock()
	defer r.mu.Unlock()
	for o := op(0); o < numOps; o++ {
		s := histStats(&r.ok[o])
		if len(r.errs[o]) > 0 {
			s.Errors = make(map[string]uint64, len(r.errs[o]))
			for k, v := range r.errs[o] {
				s.Errors[k] = v
			}
		}
		if s.Count == 0 && len(s.Errors) == 0 {
			continue
		}
		out[o.String()] = s
	}
	return out
}

// histStats summarises h (no errors).
func histStats(h *histogram) *OpStats {
	counts := h.counts()
	s := &OpStats{Count: h.count.Load()}
	// A bucket reports its middle, which may exceed the largest value seen.
	s.Max = float64(h.maxUS.Load()) / 1000
	s.P50, s.P90 = min(quantile(counts, 0.50), s.Max), min(quantile(counts, 0.90), s.Max)
	s.P99, s.P999 = min(quantile(counts, 0.99), s.Max), min(quantile(counts, 0.999), s.Max)
	if s.Count > 0 {
		s.Mean = float64(h.sumUS.Load()) / float64(s.Count) / 1000
	}
	for i, c := range counts {
		if c > 0 {
			s.Histogram = append(s.Histogram, HistBucket{LowMS: float64(bucketLow(i)) / 1000, Count: c})
		}
	}
	return s
}

// sortedOps returns the operation names of stats in a stable order.
func sortedOps(stats map[string]*OpStats) []string {
	order := map[string]int{}
	for i, n := range opNames {
		order[n] = i
	}
	names := make([]string, 0, len(stats))
	for n := range stats {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return order[names[i]] < order[names[j]] })
	return names
}
