package k8s

import (
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/workqueue"
)

// A relist after an API outage delivers every object again as an update
// of itself; the handlers must not queue those (a re-import regenerates
// every endpoint the policy selects), only real changes.
func TestUpdateHandlersSkipUnchanged(t *testing.T) {
	w := &Watcher{queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[key]())}
	t.Cleanup(w.queue.ShutDown)
	np := func(rv string) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", ResourceVersion: rv}}
	}
	crd := func(gen int64, rv string, lbls map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{}}
		u.SetNamespace("ns")
		u.SetName("m")
		u.SetGeneration(gen)
		u.SetResourceVersion(rv)
		u.SetLabels(lbls)
		return u
	}
	h := w.crdChanged(kindMNP)
	tests := []struct {
		name   string
		update func()
		queued bool
	}{
		{"networkpolicy relisted", func() { w.npUpdated(np("5"), np("5")) }, false},
		{"networkpolicy changed", func() { w.npUpdated(np("5"), np("6")) }, true},
		{"crd relisted", func() { h.OnUpdate(crd(2, "7", nil), crd(2, "7", nil)) }, false},
		{"crd status written", func() { h.OnUpdate(crd(2, "7", nil), crd(2, "8", nil)) }, false},
		{"crd spec changed", func() { h.OnUpdate(crd(2, "7", nil), crd(3, "9", nil)) }, true},
		{"crd labels changed", func() { h.OnUpdate(crd(2, "7", nil), crd(2, "9", map[string]string{"a": "b"})) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.update()
			if got := w.queue.Len() > 0; got != tt.queued {
				t.Fatalf("queued = %v, want %v", got, tt.queued)
			}
			for w.queue.Len() > 0 {
				k, _ := w.queue.Get()
				w.queue.Done(k)
				w.queue.Forget(k)
			}
		})
	}
}
