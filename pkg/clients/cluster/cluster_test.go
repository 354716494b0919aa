package cluster

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

func TestConnectivityOptionsValidate(t *testing.T) {
	ok := DefaultConnectivityOptions()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	tests := []struct {
		name string
		mod  func(*ConnectivityOptions)
		want string
	}{
		{"namespace", func(o *ConnectivityOptions) { o.Namespace = "Bad_NS" }, "namespace"},
		{"namespace-path", func(o *ConnectivityOptions) { o.Namespace = "../kube-system" }, "namespace"},
		{"image", func(o *ConnectivityOptions) { o.Image = "a b" }, "image"},
		{"pull", func(o *ConnectivityOptions) { o.PullPolicy = "Sometimes" }, "pull policy"},
		{"external-noport", func(o *ConnectivityOptions) { o.External = "1.2.3.4" }, "external target"},
		{"external-port", func(o *ConnectivityOptions) { o.External = "1.2.3.4:70000" }, "port"},
		{"external-host", func(o *ConnectivityOptions) { o.External = "bad host!:80" }, "neither"},
		{"check-timeout", func(o *ConnectivityOptions) { o.CheckTimeout = time.Millisecond }, "check timeout"},
		{"ready-timeout", func(o *ConnectivityOptions) { o.ReadyTimeout = time.Hour }, "ready timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultConnectivityOptions()
			tt.mod(&o)
			err := o.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v, want an error about %s", err, tt.want)
			}
		})
	}
	for _, ext := range []string{"10.0.0.1:443", "[fd00::1]:80", "example.com:443"} {
		o := DefaultConnectivityOptions()
		o.External = ext
		if err := o.Validate(); err != nil {
			t.Errorf("external %s: %v", ext, err)
		}
	}
}

func TestLimitedBuffer(t *testing.T) {
	b := &limitedBuffer{max: 5}
	for _, s := range []string{"abc", "def", "g"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if b.String() != "abcde" || !b.over {
		t.Fatalf("buffer %q over=%v, want abcde and over", b.String(), b.over)
	}
}

func TestAgentPods(t *testing.T) {
	a := DefaultAgents()
	pod := func(name, node string, ready bool, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: a.Namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "membrane-agent"}}, Spec: corev1.PodSpec{NodeName: node}}
		st := corev1.ConditionFalse
		if ready {
			st = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
		if deleting {
			now := metav1.Now()
			p.DeletionTimestamp = &now
		}
		return p
	}
	other := pod("other", "n1", true, false)
	other.Labels = map[string]string{"app": "x"}
	c := &Client{Kube: fake.NewClientset(pod("a-2", "n2", false, false), pod("a-1", "n1", true, false),
		pod("old", "n1", true, true), pod("pending", "", false, false), other)}
	got, err := c.AgentPods(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	want := []AgentPod{{Node: "n1", Name: "a-1", Ready: true}, {Node: "n2", Name: "a-2"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("AgentPods = %+v, want %+v", got, want)
	}
	a.Namespace = "elsewhere"
	if _, err := c.AgentPods(context.Background(), a); err == nil || !strings.Contains(err.Error(), "no agent pods") {
		t.Fatalf("no pods: %v", err)
	}
}

func TestNodeSchedulable(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	tests := []struct {
		name string
		n    corev1.Node
		want bool
	}{
		{"ready", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, true},
		{"not-ready", corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}}}, false},
		{"cordoned", corev1.Node{Spec: corev1.NodeSpec{Unschedulable: true}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, false},
		{"tainted", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, false},
		{"prefer", corev1.Node{Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectPreferNoSchedule}}},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}, true},
	}
	for _, tt := range tests {
		if got := nodeSchedulable(&tt.n); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestFlowLines(t *testing.T) {
	var got []string
	w := &flowLines{emit: func(f models.Flow) { got = append(got, f.Verdict+"@"+f.Node) }}
	for _, chunk := range []string{`{"verdict":"forwarded","node":"n1"}` + "\n" + `{"verdict":"dro`, `pped","node":"n2"}` + "\n\n", `{"verdict":"audit"}`} {
		if n, err := w.Write([]byte(chunk)); err != nil || n != len(chunk) {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"forwarded@n1", "dropped@n2", "audit@"}; !slices.Equal(got, want) {
		t.Fatalf("flows %v, want %v", got, want)
	}
	bad := &flowLines{emit: func(models.Flow) {}}
	_, _ = bad.Write([]byte("not json\n"))
	if err := bad.flush(); err == nil {
		t.Fatal("a bad line was not reported")
	}
}
