package sim

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The model is the harness's own record of every pod, the way kubelet
// sees them: what was asked, what was acknowledged. Invariants compare it
// with the agent. Everything a run needs is allocated before the heap
// baseline is taken, so that heap per live endpoint measures the agent.

// podState is where a pod is, from the harness's side.
type podState uint8

const (
	podFree     podState = iota // slot unused, or its pod's DEL was acknowledged
	podAdding                   // ADD in flight (owned by a worker)
	podLive                     // ADD acknowledged, in the live set
	podBusy                     // taken from the live set for a relabel (owned by a worker)
	podDeleting                 // DEL in flight or being retried (owned by a worker)
)

var podStateNames = [...]string{"free", "adding", "live", "busy", "deleting"}

func (s podState) String() string { return podStateNames[s] }

// podFlags record what the harness knows, or does not, about a pod.
type podFlags uint16

const (
	// flagAddAcked: the ADD was acknowledged, the endpoint exists.
	flagAddAcked podFlags = 1 << iota
	// flagIPAMUnknown: an allocation failed ambiguously; an address may be
	// allocated to the pod's owner without the harness knowing which.
	flagIPAMUnknown
	// flagCreateUnknown: a PUT failed ambiguously; the endpoint may appear
	// after the DEL that followed it.
	flagCreateUnknown
	// flagDelUnknown: a DEL failed ambiguously; it may have happened.
	flagDelUnknown
	// flagLost: reported lost (at a restart); not reported again.
	flagLost
)

// event is one entry of a pod's history.
type event struct {
	at   uint32 // milliseconds since the run started
	op   op
	res  result
	code uint16 // index into the run's codes table ("500 internal"), 0: none
}

// A pod keeps its first histHead events and the most recent ones, up to
// histLen in all: how it started, and how it ended.
const (
	histLen  = 14
	histHead = 6
)

// pod is one pod slot. A worker owns the pod while it is adding, busy or
// deleting; the live set owns it while live. Only meta is read by others.
type pod struct {
	meta  atomic.Uint64 // gen<<8 | state
	slot  int32
	pos   int32 // index in the live set, -1 when not in it
	gen   uint32
	ip    uint32 // IPv4 address, 0 when none is known
	epID  uint16
	shard uint16 // value of the k8s:shard label
	flags podFlags
	nEv   uint16
	ev    [histLen]event
}

func (p *pod) setState(s podState) { p.meta.Store(uint64(p.gen)<<8 | uint64(s)) }

// load returns the pod's generation and state; safe without owning it.
func (p *pod) load() (gen uint32, s podState) {
	m := p.meta.Load()
	return uint32(m >> 8), podState(m & 0xff)
}

func (p *pod) has(f podFlags) bool { return p.flags&f != 0 }

func (p *pod) key() podKey { return makeKey(p.slot, p.gen) }

func (p *pod) addr() netip.Addr { return u32ToAddr(p.ip) }

// podKey identifies one pod: a slot and its generation.
type podKey uint64

func makeKey(slot int32, gen uint32) podKey { return podKey(uint64(slot)<<32 | uint64(gen)) }

func (k podKey) slot() int32 { return int32(k >> 32) }
func (k podKey) gen() uint32 { return uint32(k) }

// Names of a pod: container ID sim-<slot>-<gen>, pod sim/p<slot>-<gen>.
const simNamespace = "sim"

func (k podKey) containerID() string {
	return "sim-" + strconv.Itoa(int(k.slot())) + "-" + strconv.FormatUint(uint64(k.gen()), 10)
}

func (k podKey) podName() string {
	return "p" + strconv.Itoa(int(k.slot())) + "-" + strconv.FormatUint(uint64(k.gen()), 10)
}

func (k podKey) owner() string { return simNamespace + "/" + k.podName() }

// parseContainerID is the inverse of containerID.
func parseContainerID(cid string) (podKey, bool) {
	rest, ok := strings.CutPrefix(cid, "sim-")
	if !ok {
		return 0, false
	}
	s, g, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	slot, err1 := strconv.ParseInt(s, 10, 32)
	gen, err2 := strconv.ParseUint(g, 10, 32)
	if err1 != nil || err2 != nil || slot < 0 {
		return 0, false
	}
	return makeKey(int32(slot), uint32(gen)), true
}

// parseOwner is the inverse of owner.
func parseOwner(owner string) (podKey, bool) {
	name, ok := strings.CutPrefix(owner, simNamespace+"/p")
	if !ok {
		return 0, false
	}
	return parseContainerID("sim-" + name)
}

func addrToU32(a netip.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func u32ToAddr(v uint32) netip.Addr {
	if v == 0 {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// codeTable interns outcome strings ("500 internal") for pod histories.
type codeTable struct {
	mu    sync.Mutex // guards idx and names
	idx   map[string]uint16
	names []string
}

func newCodeTable() *codeTable {
	return &codeTable{idx: map[string]uint16{"": 0}, names: []string{""}}
}

func (t *codeTable) intern(s string) uint16 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.idx[s]; ok {
		return i
	}
	if len(t.names) >= 1<<16-1 {
		return 0
	}
	i := uint16(len(t.names))
	t.idx[s] = i
	t.names = append(t.names, s)
	return i
}

func (t *codeTable) name(i uint16) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(i) < len(t.names) {
		return t.names[i]
	}
	return ""
}

// model is the harness's record of all pods.
type model struct {
	start time.Time
	codes *codeTable
	pods  []pod
	free  chan int32
	// reserved counts pods held against the target: adding, live, busy.
	reserved atomic.Int64

	liveMu sync.Mutex // guards live and the pos field of pods
	live   []int32

	ipMu    sync.Mutex // guards ipOwner
	ipBase  uint32
	ipOwner []int32 // slot+1 of the pod holding an acknowledged address, by offset

	mu sync.Mutex // guards suspects
	// suspects are finished pods whose create, or allocation, may have
	// happened unknown to the harness; the quiescence sweep looks for them.
	suspects map[podKey]podFlags
}

// newModel allocates slots pods and an ownership table for pool.
func newModel(slots int, pool netip.Prefix, start time.Time) *model {
	m := &model{start: start, codes: newCodeTable(), pods: make([]pod, slots), free: make(chan int32, slots),
		live: make([]int32, 0, slots), ipBase: addrToU32(pool.Masked().Addr()),
		ipOwner: make([]int32, 1<<(32-pool.Bits())), suspects: make(map[podKey]podFlags)}
	for i := range m.pods {
		m.pods[i].slot, m.pods[i].pos = int32(i), -1
		m.free <- int32(i)
	}
	return m
}

// since is the run time in milliseconds, for histories.
func (m *model) since() uint32 { return uint32(time.Since(m.start) / time.Millisecond) }

// slot is where event number i goes: the head, then a ring.
func histSlot(i int) int {
	if i < histHead {
		return i
	}
	return histHead + (i-histHead)%(histLen-histHead)
}

// record appends an event to p's history; the caller owns p.
func (m *model) record(p *pod, o op, res result, code string) {
	if p.nEv == 1<<16-1 {
		return
	}
	p.ev[histSlot(int(p.nEv))] = event{at: m.since(), op: o, res: res, code: m.codes.intern(code)}
	p.nEv++
}

// history renders p's events, oldest first, with a marker where events
// were dropped between the head and the tail.
func (m *model) history(p *pod) []string {
	n := int(p.nEv)
	out := make([]string, 0, histLen+1)
	for i := 0; i < n; i++ {
		if i == histHead && n > histLen {
			out = append(out, fmt.Sprintf("... %d events ...", n-histLen))
			i = n - (histLen - histHead)
		}
		e := p.ev[histSlot(i)]
		line := fmt.Sprintf("+%.3fs %s: %s", float64(e.at)/1000, e.op, e.res)
		if c := m.codes.name(e.code); c != "" {
			line += " " + c
		}
		out = append(out, line)
	}
	return out
}

// liveHistory is the history of the pod k if it is in the live set (no
// worker owns it), else nil.
func (m *model) liveHistory(k podKey) []string {
	if int(k.slot()) >= len(m.pods) {
		return nil
	}
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	p := &m.pods[k.slot()]
	if gen, _ := p.load(); p.pos < 0 || gen != k.gen() {
		return nil
	}
	return m.history(p)
}

// newPod takes a free slot for a new pod (state adding), or nil if none.
func (m *model) newPod() *pod {
	select {
	case s := <-m.free:
		p := &m.pods[s]
		p.gen++
		p.ip, p.epID, p.shard, p.flags, p.nEv = 0, 0, 0, 0, 0
		p.setState(podAdding)
		return p
	default:
		return nil
	}
}

// freePod returns p's slot; its generation stays until the slot is reused.
func (m *model) freePod(p *pod) {
	p.setState(podFree)
	m.free <- p.slot
}

// putLive adds p to the live set.
func (m *model) putLive(p *pod) {
	m.liveMu.Lock()
	p.pos = int32(len(m.live))
	m.live = append(m.live, p.slot)
	p.setState(podLive)
	m.liveMu.Unlock()
}

// takeLive removes a random live pod and gives it state st, or nil.
func (m *model) takeLive(rng *rand.Rand, st podState) *pod {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	n := len(m.live)
	if n == 0 {
		return nil
	}
	i := rng.IntN(n)
	p := &m.pods[m.live[i]]
	last := m.live[n-1]
	m.live[i] = last
	m.pods[last].pos = int32(i)
	m.live = m.live[:n-1]
	p.pos = -1
	p.setState(st)
	return p
}

func (m *model) liveCount() int {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	return len(m.live)
}

// eachLive calls fn for every live pod with the live set locked: the pods
// are not owned by any worker meanwhile.
func (m *model) eachLive(fn func(p *pod)) {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	for _, s := range m.live {
		fn(&m.pods[s])
	}
}

// ownIP records that p was given ip. It returns the slot+1 of another pod
// that still holds ip (an address handed out twice), or 0.
func (m *model) ownIP(p *pod, ip uint32) int32 {
	off := ip - m.ipBase
	if int(off) >= len(m.ipOwner) {
		return 0
	}
	m.ipMu.Lock()
	defer m.ipMu.Unlock()
	prev := m.ipOwner[off]
	m.ipOwner[off] = p.slot + 1
	if prev == p.slot+1 {
		return 0
	}
	return prev
}

// disownIP forgets that p holds its address: from the moment its release
// (or DEL) is sent, the agent may hand it to another pod.
func (m *model) disownIP(p *pod) {
	off := p.ip - m.ipBase
	if p.ip == 0 || int(off) >= len(m.ipOwner) {
		return
	}
	m.ipMu.Lock()
	if m.ipOwner[off] == p.slot+1 {
		m.ipOwner[off] = 0
	}
	m.ipMu.Unlock()
}

// suspect remembers a finished pod whose create or allocation may still
// surface (flags say which).
func (m *model) suspect(k podKey, f podFlags) {
	m.mu.Lock()
	m.suspects[k] |= f
	m.mu.Unlock()
}

func (m *model) isSuspect(k podKey, f podFlags) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.suspects[k]&f != 0
}

// classify says whether the pod named by k may exist in the agent: in
// flight (adding, busy, deleting), live, or gone (its DEL acknowledged, or
// it was never acknowledged and is not a suspect).
func (m *model) classify(k podKey) (st podState, current bool) {
	if int(k.slot()) >= len(m.pods) {
		return podFree, false
	}
	gen, s := m.pods[k.slot()].load()
	return s, gen == k.gen()
}
