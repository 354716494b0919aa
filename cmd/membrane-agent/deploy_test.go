package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"regexp"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/membrane-cni/membrane/pkg/agent"
)

// The DaemonSet's agent command, with the ConfigMap's values and the
// downward API's node name substituted as the kubelet does, is a valid
// membrane-agent command line in Kubernetes mode with --ipam kubernetes.
func TestDaemonSetFlagsParse(t *testing.T) {
	b, err := os.ReadFile("../../deploy/kubernetes/membrane.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var (
		cm *corev1.ConfigMap
		ds *appsv1.DaemonSet
	)
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		doc, err := json.Marshal(raw)
		if err != nil {
			t.Fatal(err)
		}
		switch raw["kind"] {
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			err = json.Unmarshal(doc, cm)
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			err = json.Unmarshal(doc, ds)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if cm == nil || ds == nil {
		t.Fatal("membrane.yaml: no ConfigMap or DaemonSet")
	}
	c := ds.Spec.Template.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil:
			v, ok := cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			if !ok || e.ValueFrom.ConfigMapKeyRef.Name != cm.Name {
				t.Fatalf("env %s: ConfigMap %s has no key %s", e.Name, e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Key)
			}
			env[e.Name] = v
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			env[e.Name] = "node-1"
		default:
			env[e.Name] = e.Value
		}
	}
	ref := regexp.MustCompile(`\$\(([A-Z0-9_]+)\)`)
	var args []string
	for _, a := range c.Command[1:] {
		args = append(args, ref.ReplaceAllStringFunc(a, func(m string) string {
			name := ref.FindStringSubmatch(m)[1]
			v, ok := env[name]
			if !ok {
				t.Fatalf("%s: $(%s) is not in the container's env", a, name)
			}
			return v
		}))
	}
	cfg, _, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatalf("membrane-agent %v: %v", args, err)
	}
	if cfg.K8s == nil || !cfg.K8s.InCluster || cfg.K8s.NodeName != "node-1" || cfg.IPAM != agent.IPAMKubernetes || cfg.Datapath != "linux" {
		t.Fatalf("config from the DaemonSet = k8s %+v ipam %q datapath %q", cfg.K8s, cfg.IPAM, cfg.Datapath)
	}
}
