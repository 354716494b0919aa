package events

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"
)

func publishN(h *Hub, n int) {
	for i := 0; i < n; i++ {
		// Single publisher here: the event's Seq will be Last()+1.
		h.Publish(Event{Type: EndpointCreated, Endpoint: uint16(h.Last() + 1)})
	}
}

func drain(t *testing.T, s *Subscription) []Event {
	t.Helper()
	var out []Event
	for {
		ev, ok := s.TryNext()
		if !ok {
			return out
		}
		out = append(out, ev)
	}
}

func TestSubscribe(t *testing.T) {
	tests := []struct {
		name      string
		capacity  int
		before    int    // published before Subscribe
		after     uint64 // Subscribe's argument
		published int    // published after Subscribe
		want      []uint64
		missed    uint64 // want a Missed marker first, counting this many
	}{
		{name: "only new events", capacity: 8, before: 3, after: 0, published: 2, want: []uint64{4, 5}},
		{name: "resume after an id", capacity: 8, before: 5, after: 2, published: 1, want: []uint64{3, 4, 5, 6}},
		{name: "resume from the future is new events", capacity: 8, before: 2, after: 99, published: 1, want: []uint64{3}},
		{name: "resume past the ring is told what it missed", capacity: 4, before: 10, after: 2, published: 0, missed: 4, want: []uint64{7, 8, 9, 10}},
		{name: "slow reader is told what it missed", capacity: 4, before: 0, after: 0, published: 10, missed: 6, want: []uint64{7, 8, 9, 10}},
		{name: "exactly the ring is not a miss", capacity: 4, before: 0, after: 0, published: 4, want: []uint64{1, 2, 3, 4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := New(tc.capacity)
			publishN(h, tc.before)
			s := h.Subscribe(tc.after)
			defer s.Close()
			publishN(h, tc.published)
			got := drain(t, s)
			if tc.missed > 0 {
				if len(got) == 0 || got[0].Type != Missed || got[0].Missed != tc.missed {
					t.Fatalf("first event = %+v, want a Missed marker of %d", got, tc.missed)
				}
				if got[0].Seq != tc.want[0]-1 {
					t.Errorf("marker Seq = %d, want %d (the last missed)", got[0].Seq, tc.want[0]-1)
				}
				got = got[1:]
			}
			var seqs []uint64
			for _, ev := range got {
				if ev.Type == Missed {
					t.Fatalf("unexpected marker %+v", ev)
				}
				if int(ev.Endpoint) != int(ev.Seq) {
					t.Errorf("event %d carries endpoint %d: ring slot mixed up", ev.Seq, ev.Endpoint)
				}
				seqs = append(seqs, ev.Seq)
			}
			if len(seqs) != len(tc.want) {
				t.Fatalf("got %v, want %v", seqs, tc.want)
			}
			for i := range seqs {
				if seqs[i] != tc.want[i] {
					t.Fatalf("got %v, want %v", seqs, tc.want)
				}
			}
		})
	}
}

func TestNextWaitsAndCloses(t *testing.T) {
	h := New(4)
	s := h.Subscribe(0)
	got := make(chan Event, 1)
	errc := make(chan error, 2)
	go func() {
		ev, err := s.Next(context.Background())
		if err != nil {
			errc <- err
			return
		}
		got <- ev
		_, err = s.Next(context.Background())
		errc <- err
	}()
	h.Publish(Event{Type: IdentityAllocated, Identity: 300})
	select {
	case ev := <-got:
		if ev.Type != IdentityAllocated || ev.Identity != 300 || ev.Seq != 1 || ev.Time.IsZero() {
			t.Fatalf("got %+v", ev)
		}
	case err := <-errc:
		t.Fatal(err)
	}
	s.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
	if n := h.Subscribers(); n != 0 {
		t.Fatalf("Subscribers = %d after Close", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s2 := h.Subscribe(0)
	defer s2.Close()
	if _, err := s2.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Next with a cancelled context = %v", err)
	}
}

// TestConcurrentPublishers checks, under -race, that concurrent
// publishers never block on a subscriber that does not read, and that a
// reader sees every event or a marker counting the ones it missed.
func TestConcurrentPublishers(t *testing.T) {
	h := New(64)
	idle := h.Subscribe(0) // never reads
	defer idle.Close()
	reader := h.Subscribe(0)
	defer reader.Close()
	const writers, each = 4, 2000
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			publishN(h, each)
		}()
	}
	var seen, missed uint64
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	last := uint64(0)
	for seen+missed < writers*each {
		ev, err := reader.Next(ctx)
		if err != nil {
			t.Fatalf("after %d seen and %d missed: %v", seen, missed, err)
		}
		if ev.Type == Missed {
			missed += ev.Missed
		} else {
			seen++
		}
		if ev.Seq <= last && last != 0 {
			t.Fatalf("sequence went back: %d after %d", ev.Seq, last)
		}
		last = ev.Seq
	}
	wg.Wait()
	if seen+missed != writers*each || h.Last() != writers*each {
		t.Fatalf("seen %d + missed %d, last %d; want %d", seen, missed, h.Last(), writers*each)
	}
	// The idle subscriber is told exactly how many it missed.
	ev, ok := idle.TryNext()
	if !ok || ev.Type != Missed || ev.Missed != writers*each-64 {
		t.Fatalf("idle subscriber's first event = %+v", ev)
	}
}

func TestNilHub(t *testing.T) {
	var h *Hub
	h.Publish(Event{Type: EndpointDeleted}) // must not panic
	if h.Last() != 0 || h.Subscribers() != 0 {
		t.Fatal("nil hub reports events")
	}
}

// TestRingGrows: the default hub starts with a small ring (not
// DefaultCapacity events of live heap) and keeps DefaultCapacity events
// once they come; a subscriber from the start reads them in order across
// the growth, and one left behind past a wrap gets the Missed marker for
// exactly the overwritten ones.
func TestRingGrows(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h := New(0)
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 64<<10 {
		t.Errorf("New(0) allocated %d bytes, want the ring to start small", got)
	}
	first := h.Subscribe(0)
	defer first.Close()
	publishN(h, DefaultCapacity)
	evs := drain(t, first)
	if len(evs) != DefaultCapacity {
		t.Fatalf("read %d events, want %d", len(evs), DefaultCapacity)
	}
	for i, ev := range evs {
		if ev.Seq != uint64(i+1) || ev.Endpoint != uint16(i+1) {
			t.Fatalf("event %d: seq %d endpoint %d", i, ev.Seq, ev.Endpoint)
		}
	}
	late := h.Subscribe(0)
	defer late.Close()
	publishN(h, DefaultCapacity+10) // overwrites the 10 oldest the late subscriber has not read
	evs = drain(t, late)
	if len(evs) != DefaultCapacity+1 || evs[0].Type != Missed || evs[0].Missed != 10 {
		t.Fatalf("late subscriber: %d events, first %+v; want a Missed marker for 10 and %d events", len(evs), evs[0], DefaultCapacity)
	}
	for i, ev := range evs[1:] {
		if want := uint64(DefaultCapacity + 10 + 1 + i); ev.Seq != want || ev.Endpoint != uint16(want) {
			t.Fatalf("late event %d: seq %d endpoint %d, want %d", i, ev.Seq, ev.Endpoint, want)
		}
	}
	if len(h.ring) != DefaultCapacity {
		t.Errorf("ring length %d, want %d", len(h.ring), DefaultCapacity)
	}
}
