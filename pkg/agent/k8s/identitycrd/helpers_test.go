package identitycrd_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
	"github.com/membrane-cni/membrane/pkg/agent/k8s/identitycrd"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/test/kubetest"
)

// waitTimeout bounds every wait for a condition (generous: two cores are
// shared with other suites and -race).
const waitTimeout = 60 * time.Second

var crdOnce sync.Map // *rest.Config -> *sync.Once

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// repoRoot is the repository root (this file is pkg/agent/k8s/identitycrd).
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "..")
}

// installCRD creates deploy/crds/membraneidentities.membrane.io.yaml on
// the API server of rc (once) and waits until it is established.
func installCRD(tb testing.TB, rc *rest.Config) {
	tb.Helper()
	v, _ := crdOnce.LoadOrStore(rc, &sync.Once{})
	var err error
	v.(*sync.Once).Do(func() { err = applyCRD(rc) })
	if err != nil {
		tb.Fatal(err)
	}
}

func applyCRD(rc *rest.Config) error {
	data, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "crds", "membraneidentities.membrane.io.yaml"))
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&obj); err != nil && err != io.EOF {
		return fmt.Errorf("decode CRD: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	u := &unstructured.Unstructured{Object: obj}
	if _, err := dyn.Resource(crdResource).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create CRD: %w", err)
	}
	for {
		got, err := dyn.Resource(crdResource).Get(ctx, u.GetName(), metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Established" && m["status"] == "True" {
					// The resource is served once established; give
					// discovery a moment by listing it.
					if _, err := dyn.Resource(v2.IdentityResource).List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not established: %w", u.GetName(), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// env returns the package's API server with the CRD installed.
func env(tb testing.TB) *kubetest.Env {
	tb.Helper()
	e := kubetest.Require(tb)
	installCRD(tb, e.Config)
	return e
}

// uniq is a name unique to this test process.
func uniq(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), time.Now().UnixNano()%1_000_000)
}

// newBackend starts a backend for node with cfg's other fields; closed at
// cleanup.
func newBackend(tb testing.TB, rc *rest.Config, cfg identitycrd.Config) *identitycrd.Backend {
	tb.Helper()
	b, err := identitycrd.New(rc, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = b.Close() })
	return b
}

func mustLabels(tb testing.TB, ss ...string) labels.Labels {
	tb.Helper()
	ls, err := labels.ParseSet(ss)
	if err != nil {
		tb.Fatal(err)
	}
	return ls
}

// getIdentity reads identity id from the API server (nil when absent).
func getIdentity(tb testing.TB, rc *rest.Config, id identity.NumericIdentity) *v2.MembraneIdentity {
	tb.Helper()
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	u, err := dyn.Resource(v2.IdentityResource).Get(ctx, fmt.Sprint(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		tb.Fatal(err)
	}
	mi := &v2.MembraneIdentity{}
	if err := fromUnstructured(u, mi); err != nil {
		tb.Fatal(err)
	}
	return mi
}

// keyOf is the label-set key of an object's security labels.
func keyOf(mi *v2.MembraneIdentity) string {
	var ss []string
	for k, v := range mi.SecurityLabels {
		if v == "" {
			ss = append(ss, k)
		} else {
			ss = append(ss, k+"="+v)
		}
	}
	ls, err := labels.ParseSet(ss)
	if err != nil {
		return "invalid:" + strings.Join(ss, ",")
	}
	return ls.Key()
}

func fromUnstructured(u *unstructured.Unstructured, out any) error {
	return kruntime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out)
}
