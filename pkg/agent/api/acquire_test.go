package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
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

// TestMutatingFull: a mutating call that finds every slot taken for its
// whole request timeout is answered 504 timeout, as README documents.
func TestMutatingFull(t *testing.T) {
	s := &Server{sem: make(chan struct{}, 1), cfg: Config{RequestTimeout: time.Millisecond, BodyTimeout: time.Second}}
	s.ready.Store(true)
	s.sem <- struct{}{}
	ran := false
	h := s.mutating(func(http.ResponseWriter, *http.Request) error { ran = true; return nil })
	w := httptest.NewRecorder()
	h(w, httptest.NewRequest("PUT", "/v1/endpoint/0", strings.NewReader(`{}`)))
	if ran || w.Code != http.StatusGatewayTimeout || !strings.Contains(w.Body.String(), `"code":"timeout"`) {
		t.Fatalf("full bound: ran %v, answer %d %s; want 504 timeout", ran, w.Code, w.Body)
	}
}
