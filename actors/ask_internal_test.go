package actors

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

func TestAsker(t *testing.T) {
	sys := NewSystem(slog.New(slog.DiscardHandler))
	t.Cleanup(sys.Shutdown)
	a := newAsker(sys)
	resp := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &responder{} }))
	pending := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.waiting)
	}

	t.Run("answered", func(t *testing.T) {
		res, err := a.ask(sys, resp, "ping", time.Minute)
		if err != nil || res != "pong" {
			t.Fatalf("ask = %v, %v; want pong", res, err)
		}
	})
	t.Run("timeout, late answer dropped", func(t *testing.T) {
		if _, err := a.ask(sys, resp, "hold", 10*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("ask = %v, want a deadline error", err)
		}
		if n := pending(); n != 0 {
			t.Fatalf("%d asks still waiting after the timeout", n)
		}
		sys.Root.Send(resp, "release") // the late answer
		if res, err := a.ask(sys, resp, "ping", time.Minute); err != nil || res != "pong" {
			t.Fatalf("the next ask = %v, %v; want pong", res, err)
		}
	})
	t.Run("dead target", func(t *testing.T) {
		dead := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor { return &responder{} }))
		if err := sys.Root.StopFuture(dead).Wait(); err != nil {
			t.Fatal(err)
		}
		if _, err := a.ask(sys, dead, "ping", 10*time.Second); !errors.Is(err, actor.ErrDeadLetter) {
			t.Fatalf("ask = %v, want a dead letter", err)
		}
	})
	t.Run("stop answers the waiting asks", func(t *testing.T) {
		errc := make(chan error, 1)
		go func() {
			_, err := a.ask(sys, resp, "hold", time.Minute)
			errc <- err
		}()
		for pending() == 0 {
			time.Sleep(time.Millisecond)
		}
		a.stop()
		select {
		case err := <-errc:
			if !errors.Is(err, actor.ErrDeadLetter) {
				t.Fatalf("ask = %v, want a dead letter", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a waiting ask outlived stop")
		}
		if _, err := a.ask(sys, resp, "ping", time.Minute); !errors.Is(err, actor.ErrDeadLetter) {
			t.Fatalf("ask after stop = %v, want a dead letter", err)
		}
	})
}
