//go:build linux

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/membrane-cni/membrane/pkg/testutil"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates every CRD of deploy/crds, as a deployment would
// before the DaemonSet, and waits until each kind is served.
func (c *cluster) installCRDs(ctx context.Context) error {
	files, err := filepath.Glob("../../deploy/crds/*.yaml")
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.cfg)
	if err != nil {
		return err
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := dyn.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", f, err)
		}
		group, _, _ := unstructured.NestedString(obj, "spec", "group")
		plural, _, _ := unstructured.NestedString(obj, "spec", "names", "plural")
		versions, _, _ := unstructured.NestedSlice(obj, "spec", "versions")
		if group == "" || plural == "" || len(versions) == 0 {
			return fmt.Errorf("%s: no spec.group, spec.names.plural or spec.versions", f)
		}
		version, _, _ := unstructured.NestedString(versions[0].(map[string]any), "name")
		gvr := schema.GroupVersionResource{Group: group, Version: version, Resource: plural}
		if err := testutil.WaitFor(time.Minute, func() bool {
			_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil
		}); err != nil {
			return fmt.Errorf("CRD %s never served: %w", gvr, err)
		}
	}
	return nil
}
