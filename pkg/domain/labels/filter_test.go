package labels

import (
	"strings"
	"testing"
)

func mustLabel(t testing.TB, s string) Label {
	t.Helper()
	l, err := Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestFilterDefaults(t *testing.T) {
	f, err := NewFilter(nil)
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]bool{
		"k8s:app=web":                                                      true,
		"k8s:app.kubernetes.io/name=web":                                   true,
		"k8s:io.kubernetes.pod.namespace=x":                                true,
		"k8s:io.cilium.k8s.policy.serviceaccount=default":                  true,
		"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name=x": true,
		"reserved:host":                                                    true,
		"cni:network=membrane":                                             true,
		"k8s:pod-template-hash=5d4f8c":                                     false,
		"k8s:controller-revision-hash=7b9":                                 false,
		"k8s:statefulset.kubernetes.io/pod-name=db-0":                      false,
		"k8s:apps.kubernetes.io/pod-index=0":                               false,
		"k8s:job-name=backup":                                              false,
		"k8s:controller-uid=1-2-3":                                         false,
		"k8s:batch.kubernetes.io/job-name=backup":                          false,
		"k8s:batch.kubernetes.io/controller-uid=1":                         false,
		"k8s:pod-template-generation=3":                                    false,
		"k8s:io.kubernetes.other=x":                                        false,
		"k8s:kubernetes.io/hostname=n1":                                    false,
		"k8s:annotation.foo=x":                                             false,
	} {
		if got := f.Relevant(mustLabel(t, s)); got != want {
			t.Errorf("Relevant(%s) = %v, want %v", s, got, want)
		}
	}
}

func TestFilterOperatorPatterns(t *testing.T) {
	for _, tc := range []struct {
		name     string
		patterns []string
		in       string
		want     string
	}{
		{"exclusions only keep the rest", []string{"k8s:!team"}, "k8s:app=a k8s:team=t k8s:teammate=u", "k8s:app=a"},
		{"an include keeps only what is included (and the defaults)", []string{"k8s:app"},
			"k8s:app=a k8s:env=prod k8s:app-tier=x k8s:io.kubernetes.pod.namespace=n reserved:init",
			"k8s:app=a k8s:app-tier=x k8s:io.kubernetes.pod.namespace=n reserved:init"},
		{"a longer include beats a shorter exclude", []string{`k8s:kubernetes\.io/arch`}, "k8s:kubernetes.io/arch=amd64 k8s:kubernetes.io/os=linux k8s:x=y", "k8s:kubernetes.io/arch=amd64"},
		{"an include as long as the exclude loses", []string{"k8s:pod-template-hash"}, "k8s:pod-template-hash=1 k8s:app=a", ""},
		{"the source limits the pattern", []string{"cni:!network"}, "cni:network=a k8s:network=b", "k8s:network=b"},
		{"regexp", []string{`!.*secret`}, "k8s:my-secret=1 k8s:app=a", "k8s:app=a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := NewFilter(tc.patterns)
			if err != nil {
				t.Fatal(err)
			}
			in, err := ParseSet(strings.Fields(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			kept, _ := f.Apply(in)
			if got := strings.Join(kept.Strings(), " "); got != tc.want {
				t.Fatalf("kept %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFilterBadPatterns(t *testing.T) {
	for _, p := range []string{"", "k8s:", "k8s:!", "!", "k8s:(", strings.Repeat("a", 600)} {
		if _, err := NewFilter([]string{p}); err == nil {
			t.Errorf("NewFilter(%q): no error", p)
		}
	}
}

// FuzzFilterPattern: any pattern either is refused or filters without
// panicking, never dropping a reserved label.
func FuzzFilterPattern(f *testing.F) {
	for _, s := range []string{"k8s:app", "k8s:!pod-template-hash", "!.*", "any:(a|b)+", "x:y:z", "k8s:!("} {
		f.Add(s, "k8s:pod-template-hash=1")
	}
	f.Fuzz(func(t *testing.T, pattern, label string) {
		flt, err := NewFilter([]string{pattern})
		if err != nil {
			return
		}
		if l, err := Parse(label); err == nil {
			flt.Relevant(l)
		}
		if !flt.Relevant(Label{Source: SourceReserved, Key: "host"}) {
			t.Fatal("reserved label dropped")
		}
	})
}

// TestNewPatternFilter: the pattern filter (--node-labels) has none of
// NewFilter's defaults: with no pattern it keeps every label, even those
// the defaults leave out; an include pattern keeps only what it matches.
func TestNewPatternFilter(t *testing.T) {
	host := Label{Source: "node", Key: "kubernetes.io/hostname", Value: "a"}
	zone := Label{Source: "node", Key: "topology.kubernetes.io/zone", Value: "z1"}
	all, err := NewPatternFilter(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !all.Relevant(host) || !all.Relevant(zone) {
		t.Error("the empty pattern filter left a label out")
	}
	if def, _ := NewFilter(nil); def.Relevant(host) {
		t.Error("NewFilter's defaults keep kubernetes.io/hostname; this test assumes they do not")
	}
	z, err := NewPatternFilter([]string{`topology\.kubernetes\.io`})
	if err != nil {
		t.Fatal(err)
	}
	if z.Relevant(host) || !z.Relevant(zone) {
		t.Errorf("zone filter: hostname %v zone %v, want false true", z.Relevant(host), z.Relevant(zone))
	}
	if _, err := NewPatternFilter([]string{"a("}); err == nil {
		t.Error("a bad pattern was accepted")
	}
}
