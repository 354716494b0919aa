package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
)

func TestBuckets(t *testing.T) {
	prev := -1
	for _, v := range []uint64{0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 100, 1000, 12345, 1 << 20, 1<<30 + 7, 1 << 39} {
		i := bucketOf(v)
		if lo, hi := bucketLow(i), bucketLow(i+1); v < lo || v >= hi {
			t.Errorf("bucketOf(%d) = %d covering [%d, %d)", v, i, lo, hi)
		}
		if i < prev {
			t.Errorf("bucketOf(%d) = %d, below the bucket of a smaller value (%d)", v, i, prev)
		}
		prev = i
		if lo, hi := bucketLow(i), bucketLow(i+1); v >= 8 && float64(hi-lo)/float64(lo) > 0.126 {
			t.Errorf("bucket %d is [%d, %d): wider than 12.5%%", i, lo, hi)
		}
	}
	if i := bucketOf(math.MaxUint64); i != nBuckets-1 {
		t.Errorf("bucketOf(max) = %d, want the last bucket %d", i, nBuckets-1)
	}
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		name   string
		values []time.Duration
		q      float64
		lo, hi float64 // ms
	}{
		{"empty", nil, 0.5, 0, 0},
		{"single", []time.Duration{10 * time.Millisecond}, 0.99, 9.4, 10.7},
		{"median of three", []time.Duration{time.Millisecond, 2 * time.Millisecond, 100 * time.Millisecond}, 0.5, 1.8, 2.2},
		{"p99 of a tail", append(make([]time.Duration, 98), time.Second, time.Second), 0.99, 940, 1070},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h histogram
			for _, v := range tt.values {
				h.observe(v)
			}
			if got := quantile(h.counts(), tt.q); got < tt.lo || got > tt.hi {
				t.Errorf("quantile(%g) = %g ms, want within [%g, %g]", tt.q, got, tt.lo, tt.hi)
			}
		})
	}
}

func TestRecorderStats(t *testing.T) {
	r := newRecorder()
	r.observe(opPut, 5*time.Millisecond, nil)
	r.observe(opPut, 7*time.Millisecond, nil)
	r.observe(opPut, time.Second, &client.APIError{Status: 500, Code: "internal"})
	r.observe(opDelete, time.Millisecond, errDeadline)
	st := r.stats()
	put := st["endpoint_put"]
	if put == nil || put.Count != 2 || put.Errors["500 internal"] != 1 || put.Max != 7 || put.P99 > put.Max {
		t.Fatalf("endpoint_put stats = %+v", put)
	}
	if del := st["endpoint_delete"]; del == nil || del.Count != 0 || del.Errors["timeout"] != 1 {
		t.Fatalf("endpoint_delete stats = %+v", del)
	}
	if _, ok := st["ipam_release"]; ok {
		t.Error("an operation never called is reported")
	}
	if n := r.total(); n != 4 {
		t.Errorf("total = %d, want 4", n)
	}
}

// errDeadline is what a call cut by its context's deadline returns.
var errDeadline = fmt.Errorf("delete: %w", context.DeadlineExceeded)

func TestClassify(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "unix", Err: errors.New("connection refused")}
	read := &net.OpError{Op: "read", Net: "unix", Err: errors.New("connection reset by peer")}
	tests := []struct {
		name      string
		err       error
		res       result
		code      string
		ambiguous bool
	}{
		{"nil", nil, resOK, "", false},
		{"404", &client.APIError{Status: 404, Code: "not-found"}, resAPI, "404 not-found", false},
		{"409", &client.APIError{Status: 409, Code: "conflict"}, resAPI, "409 conflict", false},
		{"500 from a dead letter", &client.APIError{Status: 500, Code: "internal"}, resAPI, "500 internal", true},
		{"503 starting", &client.APIError{Status: 503, Code: "starting"}, resAPI, "503 starting", false},
		{"504 actors timed out", &client.APIError{Status: 504, Code: "timeout"}, resAPI, "504 timeout", true},
		{"client deadline", errDeadline, resTimeout, "timeout", true},
		{"crash reset", fmt.Errorf("%w: %w", errReset, errors.New("context canceled")), resTransport, "reset", true},
		{"nothing listening", fmt.Errorf("put: %w", dial), resRefused, "refused", false},
		{"connection broke", fmt.Errorf("put: %w", read), resTransport, "transport", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, code := classify(tt.err)
			if res != tt.res || code != tt.code {
				t.Errorf("classify = %s %q, want %s %q", res, code, tt.res, tt.code)
			}
			if tt.err != nil && ambiguous(tt.err) != tt.ambiguous {
				t.Errorf("ambiguous = %v, want %v", !tt.ambiguous, tt.ambiguous)
			}
		})
	}
}
