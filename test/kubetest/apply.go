package kubetest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// FieldManager is the field manager of the harness's server-side applies.
const FieldManager = "kubetest"

// RepoRoot is the repository's root directory (the harness's source is
// test/kubetest inside it).
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// ReadObjects decodes every object of a YAML (or JSON) stream with "---"
// separators; empty documents are skipped.
func ReadObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode object %d: %w", len(out)+1, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Apply server-side applies objs in order with the field manager, CRDs
// first: each CRD is waited for until Established before the objects
// after it are mapped. A namespaced object without a namespace goes to
// "default". Returns the applied objects as the server answered.
func Apply(ctx context.Context, cfg *rest.Config, manager string, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("apply: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	var crds, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, o)
		} else {
			rest = append(rest, o)
		}
	}
	var out []*unstructured.Unstructured
	for i, group := range [][]*unstructured.Unstructured{crds, rest} {
		for _, o := range group {
			got, err := applyOne(ctx, dyn, mapper, manager, o)
			if err != nil {
				return out, err
			}
			out = append(out, got)
		}
		if i == 0 {
			for _, c := range crds {
				if err := WaitEstablished(ctx, dyn, c.GetName()); err != nil {
					return out, err
				}
			}
			mapper.Reset()
		}
	}
	return out, nil
}

func applyOne(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, manager string, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
	}
	var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		ns := o.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		r = dyn.Resource(m.Resource).Namespace(ns)
	}
	got, err := r.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: manager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
	}
	return got, nil
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// WaitEstablished waits until the CRD name is Established and its names
// accepted, or ctx ends.
func WaitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	var last string
	for {
		u, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
			est, names := false, false
			for _, c := range conds {
				m, _ := c.(map[string]any)
				ok := m["status"] == "True"
				est = est || m["type"] == "Established" && ok
				names = names || m["type"] == "NamesAccepted" && ok
			}
			if est && names {
				return nil
			}
			last = fmt.Sprint(conds)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("crd %s not established: %s: %w", name, last, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CRDFiles are deploy/crds/*.yaml.
func CRDFiles() ([]string, error) {
	return filepath.Glob(filepath.Join(RepoRoot(), "deploy", "crds", "*.yaml"))
}

// ApplyFiles server-side applies every object of the files (see Apply).
func ApplyFiles(ctx context.Context, cfg *rest.Config, manager string, files ...string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("apply: %w", err)
		}
		o, err := ReadObjects(b)
		if err != nil {
			return nil, fmt.Errorf("apply %s: %w", f, err)
		}
		objs = append(objs, o...)
	}
	return Apply(ctx, cfg, manager, objs)
}

var crdsOnce = map[*Env]*sync.Once{}
var crdsMu sync.Mutex

// InstallCRDs applies deploy/crds/*.yaml to e once per Env (tests of the
// agent, which waits for their informers at start).
func (e *Env) InstallCRDs(tb testing.TB) {
	tb.Helper()
	crdsMu.Lock()
	once, ok := crdsOnce[e]
	if !ok {
		once = &sync.Once{}
		crdsOnce[e] = once
	}
	crdsMu.Unlock()
	var err error
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var files []string
		if files, err = CRDFiles(); err == nil {
			_, err = ApplyFiles(ctx, e.Config, FieldManager, files...)
		}
	})
	if err != nil {
		tb.Fatalf("install CRDs: %v", err)
	}
}

var ciliumCRDsOnce = map[*Env]*sync.Once{}

// InstallCiliumCRDs applies test/kubetest/testdata/cilium.io-crds.yaml
// (Cilium's policy kinds) to e once per Env.
func (e *Env) InstallCiliumCRDs(tb testing.TB) {
	tb.Helper()
	crdsMu.Lock()
	once, ok := ciliumCRDsOnce[e]
	if !ok {
		once = &sync.Once{}
		ciliumCRDsOnce[e] = once
	}
	crdsMu.Unlock()
	var err error
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		_, err = ApplyFiles(ctx, e.Config, FieldManager, filepath.Join(RepoRoot(), "test", "kubetest", "testdata", "cilium.io-crds.yaml"))
	})
	if err != nil {
		tb.Fatalf("install cilium.io CRDs: %v", err)
	}
}

// Delete deletes objs in reverse order (the order Apply's caller gave
// reversed, as helm uninstall deletes a release), with background
// propagation (the garbage collector removes dependents, a DaemonSet's
// pods say); an object already gone is no error. A namespaced object
// without a namespace is in "default".
func Delete(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	background := metav1.DeletePropagationBackground
	for i := len(objs) - 1; i >= 0; i-- {
		o := objs[i]
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("delete %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			r = dyn.Resource(m.Resource).Namespace(cmp.Or(o.GetNamespace(), metav1.NamespaceDefault))
		}
		err = r.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &background})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}
