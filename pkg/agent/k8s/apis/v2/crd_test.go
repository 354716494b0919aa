package v2_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	v2 "github.com/membrane-cni/membrane/pkg/agent/k8s/apis/v2"
)

var update = flag.Bool("update", false, "rewrite deploy/crds/ from the Go types")

// crdDir is deploy/crds relative to this package.
var crdDir = filepath.Join("..", "..", "..", "..", "..", "deploy", "crds")

// policyCRDs are the CRDs generated from Go types, by file.
var policyCRDs = []struct {
	file, kind, plural, singular, short, scope string
	typ                                        reflect.Type
}{
	{"membranenetworkpolicies.membrane.io.yaml", v2.KindNetworkPolicy, v2.ResourceNetworkPolicies,
		"membranenetworkpolicy", "mnp", "Namespaced", reflect.TypeOf(v2.MembraneNetworkPolicy{})},
	{"membraneclusterwidenetworkpolicies.membrane.io.yaml", v2.KindClusterwideNetworkPolicy, v2.ResourceClusterwideNetworkPolicies,
		"membraneclusterwidenetworkpolicy", "mcnp", "Cluster", reflect.TypeOf(v2.MembraneClusterwideNetworkPolicy{})},
}

// TestCRDSchemas checks that the committed CRDs are what the Go types
// generate (go test ./pkg/agent/k8s/apis/v2 -update rewrites them), so
// the schema never prunes a field the types declare.
func TestCRDSchemas(t *testing.T) {
	for _, c := range policyCRDs {
		t.Run(c.kind, func(t *testing.T) {
			crd := map[string]any{
				"apiVersion": "apiextensions.k8s.io/v1",
				"kind":       "CustomResourceDefinition",
				"metadata":   map[string]any{"name": c.plural + "." + v2.Group},
				"spec": map[string]any{
					"group": v2.Group,
					"names": map[string]any{"kind": c.kind, "listKind": c.kind + "List", "plural": c.plural,
						"singular": c.singular, "shortNames": []string{c.short}, "categories": []string{"membrane"}},
					"scope": c.scope,
					"versions": []any{map[string]any{
						"name": v2.Version, "served": true, "storage": true,
						"subresources": map[string]any{"status": map[string]any{}},
						"schema":       map[string]any{"openAPIV3Schema": topSchema(c.typ)},
					}},
				},
			}
			body, err := yaml.Marshal(crd)
			if err != nil {
				t.Fatal(err)
			}
			want := append([]byte("# Generated from pkg/agent/k8s/apis/v2 (policy.go) by TestCRDSchemas:\n"+
				"# go test ./pkg/agent/k8s/apis/v2 -update rewrites it. Do not edit.\n"), body...)
			path := filepath.Join(crdDir, c.file)
			if *update {
				if err := os.WriteFile(path, want, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s differs from the Go types; run go test ./pkg/agent/k8s/apis/v2 -update", path)
			}
		})
	}
}

// topSchema is the object's schema: header, spec, specs, status.
func topSchema(t reflect.Type) map[string]any {
	props := map[string]any{
		"apiVersion": map[string]any{"type": "string"},
		"kind":       map[string]any{"type": "string"},
		"metadata":   map[string]any{"type": "object"},
	}
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous {
			continue
		}
		props[jsonName(f)] = schemaOf(f.Type)
	}
	return map[string]any{"type": "object", "properties": props,
		"description": "The spec of a Cilium network policy (cilium.io/v2): give spec (one rule) or specs (a list)."}
}

var (
	timeType   = reflect.TypeOf(metav1.Time{})
	intstrType = reflect.TypeOf(intstr.IntOrString{})
)

// schemaOf is the structural schema of t.
func schemaOf(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t == timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case t == intstrType:
		return map[string]any{"x-kubernetes-int-or-string": true}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int32:
		return map[string]any{"type": "integer", "format": "int32"}
	case reflect.Int64, reflect.Uint64:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case reflect.Map:
		if t.Elem().Kind() == reflect.Interface {
			return map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
		}
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem())}
	case reflect.Struct:
		props := map[string]any{}
		var required []string
		for i := range t.NumField() {
			f := t.Field(i)
			name := jsonName(f)
			if name == "" || name == "-" {
				continue
			}
			props[name] = schemaOf(f.Type)
			if !strings.Contains(f.Tag.Get("json"), "omitempty") {
				required = append(required, name)
			}
		}
		s := map[string]any{"type": "object", "properties": props}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	}
	panic("schemaOf: unsupported type " + t.String())
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}
