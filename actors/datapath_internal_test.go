package actors

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
)

// TestPoolBacklogDrains: many more jobs than workers, sent at once, all
// run and are answered (the backlog is handed out as workers free up,
// without a message per finished job), and the counters add up.
func TestPoolBacklogDrains(t *testing.T) {
	sys := NewSystem(slog.New(slog.DiscardHandler))
	t.Cleanup(sys.Shutdown)
	pool := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
		return newPoolActor(PoolConfig{Workers: 2, DefaultTimeout: time.Minute}, slog.New(slog.DiscardHandler))
	}))
	const jobs = 500
	errOdd := errors.New("odd job")
	futures := make([]*actor.Future, jobs)
	for i := range jobs {
		work := &messages.DatapathWork{Op: "test", Run: func(context.Context) (any, error) {
			runtime.Gosched() // let the actor and the other worker interleave
			if i%2 == 1 {
				return nil, errOdd
			}
			return i, nil
		}}
		futures[i] = sys.Root.RequestFuture(pool, work, time.Minute)
	}
	for i, f := range futures {
		res, err := f.Result()
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
		dr := res.(*messages.DatapathResult)
		if (i%2 == 1) != errors.Is(dr.Err, errOdd) || (i%2 == 0 && dr.Value != i) {
			t.Fatalf("job %d answered %v, %v", i, dr.Value, dr.Err)
		}
	}
	res, err := sys.Root.RequestFuture(pool, &getPoolStats{}, time.Minute).Result()
	if err != nil {
		t.Fatal(err)
	}
	st := res.(*PoolStats)
	if st.Done != jobs || st.Failed != jobs/2 || st.Backlog != 0 || st.Busy != 0 || st.Workers != 2 {
		t.Fatalf("pool stats %+v, want %d done, %d failed, nothing busy or waiting", st, jobs, jobs/2)
	}
}
