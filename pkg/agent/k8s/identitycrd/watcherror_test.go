package identitycrd

import (
	"errors"
	"fmt"
	"io"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestWatchErrorRoutine: the reflector's routine watch ends (closed by
// the server, resourceVersion compacted: 410) leave the store healthy; a
// real failure marks it unhealthy.
func TestWatchErrorRoutine(t *testing.T) {
	b := &Backend{}
	b.status.Healthy = true
	for _, err := range []error{
		io.EOF,
		apierrors.NewResourceExpired("too old resource version: 1 (2)"),
		apierrors.NewGone("gone"),
		fmt.Errorf("watch: %w", apierrors.NewResourceExpired("too old")),
	} {
		b.watchError(err)
		if !b.status.Healthy {
			t.Fatalf("%v: store marked unhealthy", err)
		}
	}
	for _, err := range []error{
		errors.New("dial tcp 10.0.0.1:6443: connect: connection refused"),
		apierrors.NewForbidden(schema.GroupResource{Group: "membrane.io", Resource: "membraneidentities"}, "", errors.New("no")),
	} {
		b.status.Healthy = true
		b.watchError(err)
		if b.status.Healthy {
			t.Fatalf("%v: store still healthy", err)
		}
	}
}
