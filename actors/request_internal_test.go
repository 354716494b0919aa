package actors

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// requestingActor is an actor that makes requests through a requester
// (the code under test) on command and reports each continuation.
type requestingActor struct {
	req     requester
	results chan requestResult
}

type requestResult struct {
	res any
	err error
}

// doRequest asks the requester to request msg from to.
type doRequest struct {
	to      *actor.PID
	msg     any
	timeout time.Duration
}

func (r *requestingActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		r.req.register(ctx)
	case *actor.Stopping:
		r.req.drop()
	case *actor.Stopped:
		r.req.unregister(ctx)
	case *doRequest:
		r.req.request(ctx, msg.to, msg.msg, msg.timeout, func(res any, err error) {
			r.results <- requestResult{res, err}
		})
	case *requestAnswer:
		r.req.answered(msg)
	}
}

// responder answers "ping" with "pong", keeps "hold" unanswered until
// "release", and then answers it "late".
type responder struct{ held *actor.PID }

func (r *responder) Receive(ctx actor.Context) {
	switch ctx.Message() {
	case "ping":
		ctx.Respond("pong")
	case "hold":
		r.held = ctx.Sender()
	case "release":
		ctx.Send(r.held, "late")
	}
}

func TestEndpointRequests(t *testing.T) {
	sys := NewSystem(slog.New(slog.DiscardHandler))
	t.Cleanup(sys.Shutdown)
	resp := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &responder{} }))
	results := make(chan requestResult, 4)
	req := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &requestingActor{results: results} }))
	wait := func(t *testing.T) requestResult {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no continuation")
			return requestResult{}
		}
	}

	t.Run("answered", func(t *testing.T) {
		sys.Root.Send(req, &doRequest{to: resp, msg: "ping", timeout: time.Minute})
		if r := wait(t); r.err != nil || r.res != "pong" {
			t.Fatalf("continued with %v, %v; want pong", r.res, r.err)
		}
	})
	t.Run("timeout, late answer dropped", func(t *testing.T) {
		sys.Root.Send(req, &doRequest{to: resp, msg: "hold", timeout: 10 * time.Millisecond})
		if r := wait(t); !errors.Is(r.err, actor.ErrTimeout) {
			t.Fatalf("continued with %v, %v; want a timeout", r.res, r.err)
		}
		sys.Root.Send(resp, "release") // the late answer reaches the requester
		sys.Root.Send(req, &doRequest{to: resp, msg: "ping", timeout: time.Minute})
		if r := wait(t); r.res != "pong" {
			t.Fatalf("the next request continued with %v, %v: the late answer was taken for it", r.res, r.err)
		}
		select {
		case r := <-results:
			t.Fatalf("a second continuation: %v, %v", r.res, r.err)
		case <-time.After(50 * time.Millisecond):
		}
	})
	t.Run("the timer of an answered request fires harmlessly", func(t *testing.T) {
		sys.Root.Send(req, &doRequest{to: resp, msg: "ping", timeout: 20 * time.Millisecond})
		if r := wait(t); r.err != nil || r.res != "pong" {
			t.Fatalf("continued with %v, %v; want pong", r.res, r.err)
		}
		select {
		case r := <-results:
			t.Fatalf("a second continuation after the deadline: %v, %v", r.res, r.err)
		case <-time.After(100 * time.Millisecond):
		}
	})
	t.Run("each expired request times out once, a later one waits", func(t *testing.T) {
		sys.Root.Send(req, &doRequest{to: resp, msg: "hold", timeout: time.Hour})
		sys.Root.Send(req, &doRequest{to: resp, msg: "hold", timeout: 10 * time.Millisecond})
		sys.Root.Send(req, &doRequest{to: resp, msg: "hold", timeout: 30 * time.Millisecond})
		for range 2 {
			if r := wait(t); !errors.Is(r.err, actor.ErrTimeout) {
				t.Fatalf("continued with %v, %v; want a timeout", r.res, r.err)
			}
		}
		select {
		case r := <-results:
			t.Fatalf("the hour-long request continued with %v, %v", r.res, r.err)
		case <-time.After(100 * time.Millisecond):
		}
		sys.Root.Send(resp, "release") // answers the last held request, the 30 ms one: dropped
		select {
		case r := <-results:
			t.Fatalf("a late answer continued a request: %v, %v", r.res, r.err)
		case <-time.After(50 * time.Millisecond):
		}
	})
	t.Run("answers process removed at stop", func(t *testing.T) {
		if err := sys.Root.StopFuture(req).Wait(); err != nil {
			t.Fatal(err)
		}
		for _, bucket := range sys.ProcessRegistry.LocalPIDs.LocalPIDs {
			for _, id := range bucket.Keys() {
				if strings.HasSuffix(id, answersSuffix) {
					t.Errorf("%s still registered", id)
				}
			}
		}
	})
}
