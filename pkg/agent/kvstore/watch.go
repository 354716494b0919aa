package kvstore

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// lister consumes a list-then-watch of one prefix.
type lister interface {
	// list gets the full set of keys under the prefix: the first time,
	// and again after a compaction or a broken watch. The consumer
	// replaces what it knew (mark-and-sweep).
	list(kvs []*mvccpb.KeyValue)
	// events gets the changes after the last list, in revision order.
	events(evs []*clientv3.Event)
}

// listWatch lists prefix and watches it from the listed revision on,
// until ctx ends. A compacted or failed watch re-lists: a consumer never
// misses a deletion, it sees the key gone from the next list.
func (c *Client) listWatch(ctx context.Context, prefix string, l lister) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		resumed := c.Resumed()
		var resp *clientv3.GetResponse
		err := c.call(ctx, "list "+prefix, func(ctx context.Context) (err error) {
			resp, err = c.cli.Get(ctx, prefix, clientv3.WithPrefix())
			return err
		})
		if err != nil {
			if !sleepOr(ctx, backoff, resumed, nil) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		l.list(resp.Kvs)
		c.watchFrom(ctx, prefix, resp.Header.Revision+1, l)
	}
}

// watchFrom watches prefix from rev until the watch fails (the caller
// re-lists) or ctx ends.
func (c *Client) watchFrom(ctx context.Context, prefix string, rev int64, l lister) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for resp := range c.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := resp.Err(); err != nil {
			if resp.CompactRevision != 0 {
				c.log.Info("watch compacted; listing again", "prefix", prefix, "compacted", resp.CompactRevision)
			} else {
				c.observe(err)
				c.log.Warn("watch failed; listing again", "prefix", prefix, "err", err)
				sleep(ctx, 200*time.Millisecond)
			}
			return
		}
		if len(resp.Events) > 0 {
			l.events(resp.Events)
		}
	}
}
