package api

import (
	"context"
	"testing"
	"time"
)

// TestAcquire checks the in-flight bound: free slots are taken, a full
// bound waits until its context ends, a released slot is taken again.
func TestAcquire(t *testing.T) {
	s := &Server{sem: make(chan struct{}, 2)}
	bg := context.Background()
	first, second := s.acquire(bg), s.acquire(bg)
	if !first || !second {
		t.Fatal("free slots refused")
	}
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	defer cancel()
	if s.acquire(ctx) {
		t.Fatal("a full bound let a third call in")
	}
	if ctx.Err() == nil {
		t.Fatal("acquire gave up before its context ended")
	}
	got := make(chan bool)
	go func() { got <- s.acquire(bg) }()
	<-s.sem // a call ends
	if !<-got {
		t.Fatal("a waiting call did not get the released slot")
	}
}
