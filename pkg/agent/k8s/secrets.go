package k8s

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// SecretSink takes the values of the header secrets ("ns/name" to the
// value) after each change of the Secrets watched (the Linux datapath's
// SetPolicySecrets, which hands them to the L7 proxy). The values are
// never logged.
type SecretSink interface {
	SetPolicySecrets(values map[string]string)
}

// secretWatch watches the Secrets of the one policy secrets namespace
// and hands the values of those holding exactly one entry (Cilium's
// rule) to the sink: a Secret created, changed or deleted changes the
// header matches naming it without a restart. The informer lists and
// watches that namespace only, the only one the agent's Role grants.
type secretWatch struct {
	ns      string
	sink    SecretSink
	lister  corelisters.SecretNamespaceLister
	factory informers.SharedInformerFactory
	w       *Watcher
}

// newSecretWatch returns nil when there is nothing to watch (no
// namespace or no sink).
func newSecretWatch(w *Watcher, client kubernetes.Interface, ns string, sink SecretSink) *secretWatch {
	if ns == "" || sink == nil {
		return nil
	}
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Secrets()
	return &secretWatch{ns: ns, sink: sink, lister: inf.Lister().Secrets(ns), factory: f, w: w}
}

func (s *secretWatch) informer() cache.SharedIndexInformer {
	return s.factory.Core().V1().Secrets().Informer()
}

func (s *secretWatch) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.publish() },
		UpdateFunc: func(o, n any) { s.publish() },
		DeleteFunc: func(any) { s.publish() },
	}
}

// publish hands every usable Secret of the namespace to the sink. A
// Secret without exactly one entry does not resolve (its matches fail,
// or use their value); it is reported by name, never by content.
func (s *secretWatch) publish() {
	list, err := s.lister.List(k8slabels.Everything())
	if err != nil {
		s.w.log.Warn("list policy secrets", "namespace", s.ns, "err", err)
		return
	}
	values := make(map[string]string, len(list))
	for _, sec := range list {
		v, ok := secretValue(sec)
		if !ok {
			s.w.log.Warn("policy secret ignored: it must hold exactly one entry; header matches naming it fail (or use their value)",
				"secret", sec.Namespace+"/"+sec.Name, "entries", slices.Sorted(maps.Keys(sec.Data)))
			continue
		}
		values[sec.Namespace+"/"+sec.Name] = v
	}
	s.sink.SetPolicySecrets(values)
}

// secretValue is the one entry of sec (Cilium: "must have exactly one
// item").
func secretValue(sec *corev1.Secret) (string, bool) {
	if len(sec.Data) != 1 {
		return "", false
	}
	for _, v := range sec.Data {
		return string(v), true
	}
	return "", false
}
