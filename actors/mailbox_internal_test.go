package actors

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// recordingInvoker records what a mailbox hands it; a user message
// "panic" panics.
type recordingInvoker struct {
	mu     sync.Mutex
	got    []any
	failed []any
	done   chan struct{}
	want   int
}

func (r *recordingInvoker) add(list *[]any, m any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*list = append(*list, m)
	if len(r.got)+len(r.failed) == r.want {
		close(r.done)
	}
}

func (r *recordingInvoker) InvokeSystemMessage(m any) { r.add(&r.got, m) }

func (r *recordingInvoker) InvokeUserMessage(m any) {
	if m == "panic" {
		panic("boom")
	}
	r.add(&r.got, m)
}

func (r *recordingInvoker) EscalateFailure(reason, m any) {
	r.add(&r.failed, fmt.Sprint(reason, ":", m))
}

// expect makes wait return once n messages arrived in all.
func (r *recordingInvoker) expect(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done, r.want = make(chan struct{}), n
}

func (r *recordingInvoker) wait(t *testing.T) []any {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("mailbox delivered %v (failed %v), want %d", r.got, r.failed, r.want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// gatedDispatcher runs a mailbox only once open is closed, so messages
// posted before queue up.
type gatedDispatcher struct{ open chan struct{} }

func (d gatedDispatcher) Schedule(fn func()) { go func() { <-d.open; fn() }() }
func (d gatedDispatcher) Throughput() int    { return 2 }

func newTestMailbox(want int) (*mailbox, *recordingInvoker, chan struct{}, *MailboxStats) {
	stats := &MailboxStats{}
	m := newMailbox(stats)
	inv := &recordingInvoker{done: make(chan struct{}), want: want}
	open := make(chan struct{})
	m.RegisterHandlers(inv, gatedDispatcher{open: open})
	m.Start()
	return m, inv, open, stats
}

func TestMailboxOrder(t *testing.T) {
	m, inv, open, stats := newTestMailbox(7)
	for i := range 5 {
		m.PostUserMessage(i)
	}
	m.PostSystemMessage("sys-a")
	m.PostSystemMessage("sys-b")
	if n := m.UserMessageCount(); n != 5 {
		t.Errorf("UserMessageCount %d, want 5", n)
	}
	if d := stats.Depth(); d != 7 {
		t.Errorf("depth %d before the run, want 7", d)
	}
	close(open)
	got := inv.wait(t)
	if want := []any{"sys-a", "sys-b", 0, 1, 2, 3, 4}; !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v (system messages first, each queue in order)", got, want)
	}
	if stats.Processed() != 7 {
		t.Fatalf("processed %d, want 7", stats.Processed())
	}
}

func TestMailboxSuspendHoldsUserMessages(t *testing.T) {
	m, inv, open, _ := newTestMailbox(1)
	m.PostSystemMessage(&actor.SuspendMailbox{})
	m.PostUserMessage("held")
	m.PostSystemMessage("sys")
	close(open)
	inv.wait(t)
	inv.expect(2)
	m.PostSystemMessage("sys2")
	if got := inv.wait(t); !slices.Equal(got, []any{"sys", "sys2"}) {
		t.Fatalf("while suspended: delivered %v, want [sys sys2]", got)
	}
	inv.expect(3)
	m.PostSystemMessage(&actor.ResumeMailbox{})
	if got := inv.wait(t); !slices.Equal(got, []any{"sys", "sys2", "held"}) {
		t.Fatalf("after resume: delivered %v, want [sys sys2 held]", got)
	}
}

func TestMailboxPanicEscalates(t *testing.T) {
	m, inv, open, _ := newTestMailbox(3)
	m.PostUserMessage("a")
	m.PostUserMessage("panic")
	m.PostUserMessage("b")
	close(open)
	got := inv.wait(t)
	inv.mu.Lock()
	failed := slices.Clone(inv.failed)
	inv.mu.Unlock()
	if !slices.Equal(got, []any{"a", "b"}) || !slices.Equal(failed, []any{"boom:panic"}) {
		t.Fatalf("delivered %v, escalated %v; want [a b] and [boom:panic]", got, failed)
	}
}

func TestMailboxConcurrentProducers(t *testing.T) {
	const producers, each = 8, 2000
	stats := &MailboxStats{}
	m := newMailbox(stats)
	inv := &recordingInvoker{done: make(chan struct{}), want: producers * each}
	m.RegisterHandlers(inv, newWorkerDispatcher(300, time.Second))
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				m.PostUserMessage([2]int{p, i})
			}
		}()
	}
	wg.Wait()
	got := inv.wait(t)
	next := make([]int, producers)
	for _, v := range got {
		pi := v.([2]int)
		if pi[1] != next[pi[0]] {
			t.Fatalf("producer %d: got message %d, want %d (order lost)", pi[0], pi[1], next[pi[0]])
		}
		next[pi[0]]++
	}
	if stats.Depth() != 0 || stats.Processed() != producers*each {
		t.Fatalf("depth %d processed %d", stats.Depth(), stats.Processed())
	}
}

// BenchmarkMailbox posts messages one at a time to an idle mailbox run
// by the shared dispatcher (each post schedules it): allocations per
// message, protoactor's default mailbox against this one.
func BenchmarkMailbox(b *testing.B) {
	for _, c := range []struct {
		name string
		mb   actor.MailboxProducer
	}{{"protoactor", actor.Unbounded()}, {"membrane", unboundedWithStats(&MailboxStats{})}} {
		b.Run(c.name, func(b *testing.B) {
			m := c.mb()
			done := make(chan struct{}, 1)
			m.RegisterHandlers(benchInvoker{done}, dispatcher)
			b.ReportAllocs()
			for b.Loop() {
				m.PostUserMessage(b)
				<-done
			}
		})
	}
}

type benchInvoker struct{ done chan struct{} }

func (benchInvoker) InvokeSystemMessage(any)  {}
func (i benchInvoker) InvokeUserMessage(any)  { i.done <- struct{}{} }
func (benchInvoker) EscalateFailure(any, any) {}
