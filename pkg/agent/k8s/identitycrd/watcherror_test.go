package identitycrd

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
		&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: http.StatusGone, Reason: metav1.StatusReasonGone}},
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
