package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/index"
)

// healthAnnotationEvery is how often the health publisher compares the
// health endpoint with this node's annotations.
const healthAnnotationEvery = time.Second

// healthPublisher publishes this node's health endpoint addresses in its
// Node's annotations (HealthIPv4Annotation, HealthIPv6Annotation), as
// Cilium's agent annotated its Node before CiliumNode's spec.health: the
// endpoint with the identity health (pkg/agent/health's), read from the
// index, compared with the Node in the informer's cache every
// healthAnnotationEvery and merge-patched when they differ (an address
// the endpoint no longer has is removed). Needs RBAC patch on nodes; a
// refused or failed patch is logged once per distinct error and retried.
type healthPublisher struct {
	node  string
	cs    kubernetes.Interface
	nodes corelisters.NodeLister
	ix    *index.Index
	log   *slog.Logger
	// synced tells whether the Node cache has synced (no patch before).
	synced func() bool

	lastErr string // the worker's only
}

// want is what the annotations should hold: the health endpoint's
// addresses by annotation ("" for a family it has none of).
func (h *healthPublisher) want() map[string]string {
	out := map[string]string{HealthIPv4Annotation: "", HealthIPv6Annotation: ""}
	for _, ep := range h.ix.Endpoints(index.EndpointFilter{}) {
		if ep.Identity != identity.ReservedHealth || ep.State == endpoint.StateDisconnecting || ep.State == endpoint.StateDisconnected {
			continue
		}
		if ep.IPv4.IsValid() {
			out[HealthIPv4Annotation] = ep.IPv4.String()
		}
		if ep.IPv6.IsValid() {
			out[HealthIPv6Annotation] = ep.IPv6.String()
		}
	}
	return out
}

func (h *healthPublisher) run(ctx context.Context) {
	t := time.NewTicker(healthAnnotationEvery)
	defer t.Stop()
	for {
		err := h.sync(ctx)
		switch {
		case err != nil && err.Error() != h.lastErr:
			h.log.Warn("health endpoint addresses not published in the Node's annotations; other nodes do not probe it", "err", err)
			h.lastErr = err.Error()
		case err == nil && h.lastErr != "":
			h.log.Info("health endpoint addresses published in the Node's annotations")
			h.lastErr = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sync patches the Node when its annotations differ from want.
func (h *healthPublisher) sync(ctx context.Context) error {
	if !h.synced() {
		return nil
	}
	node, err := h.nodes.Get(h.node)
	if err != nil {
		return fmt.Errorf("node %s: %w", h.node, err)
	}
	patch := map[string]any{}
	for k, v := range h.want() {
		cur, has := node.Annotations[k]
		switch {
		case v == "" && has:
			patch[k] = nil
		case v != "" && cur != v:
			patch[k] = v
		}
	}
	if len(patch) == 0 {
		return nil
	}
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, applyTimeout)
	defer cancel()
	if _, err := h.cs.CoreV1().Nodes().Patch(ctx, h.node, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch node %s annotations: %w", h.node, err)
	}
	h.log.Info("health endpoint addresses published", "annotations", patch)
	return nil
}
