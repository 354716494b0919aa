package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"sigs.k8s.io/yaml"
)

var (
	// ErrInvalidPolicy is wrapped by every error Parse returns.
	ErrInvalidPolicy = errors.New("invalid policy")
	// ErrNotFound is returned when a delete by name matches no policy.
	ErrNotFound = errors.New("policy not found")
	// ErrNoProxy is returned by MapState.Redirects when no proxy listens
	// for an entry's L7 parser.
	ErrNoProxy = errors.New("no L7 proxy port")
)

// Kinds of policy documents.
const (
	KindCNP = "CiliumNetworkPolicy"
	KindKNP = "NetworkPolicy"
	// KindCCNP is Cilium's cluster-wide policy: the CNP spec, no
	// namespace, selectors not restricted to one.
	KindCCNP = "CiliumClusterwideNetworkPolicy"
	// KindMNP and KindMCNP are Membrane's custom resources (apiVersion
	// APIVersionMembrane) with the spec of KindCNP and KindCCNP.
	KindMNP  = "MembraneNetworkPolicy"
	KindMCNP = "MembraneClusterwideNetworkPolicy"
	// APIVersionCNP and APIVersionKNP are the accepted apiVersions.
	APIVersionCNP = "cilium.io/v2"
	APIVersionKNP = "networking.k8s.io/v1"
	// APIVersionMembrane is the apiVersion of KindMNP and KindMCNP.
	APIVersionMembrane = "membrane.io/v2"
	// DefaultNamespace is the namespace of a policy that names none.
	DefaultNamespace = "default"
)

// Policy is one imported policy document, compiled. It is immutable once
// returned by Parse.
type Policy struct {
	Kind      string
	Name      string
	Namespace string
	Labels    map[string]string
	// Spec is the document's spec as imported ("specs" for a
	// CiliumNetworkPolicy with a list of rules).
	Spec json.RawMessage
	// Raw is the whole document as JSON (what policy.json stores).
	Raw json.RawMessage
	// Rules are the compiled rules.
	Rules []Rule
	// FromAPIServer: the document is an object of the API server
	// (SourceAnnotation "kubernetes").
	FromAPIServer bool
	// Refused are the parts of the document the agent refused while
	// enforcing the rest (ParseOptions.PartialRefusal; empty otherwise):
	// each allows nothing.
	Refused []Refusal
}

// Key returns the policy's unique name (KeyOf; KeyOfObject for a
// CiliumNetworkPolicy or CiliumClusterwideNetworkPolicy read from the
// API server).
func (p *Policy) Key() string {
	if p.FromAPIServer && (p.Kind == KindCNP || p.Kind == KindCCNP) {
		return KeyOfObject(p.Kind, p.Namespace, p.Name)
	}
	return KeyOf(p.Kind, p.Namespace, p.Name)
}

// SourceAnnotation on a document's metadata names where it comes from:
// "kubernetes" for an object of the API server.
const SourceAnnotation = "membrane.io/source"

// KeyOfObject is the unique name of a CiliumNetworkPolicy or
// CiliumClusterwideNetworkPolicy object read from the API server:
// prefixed with its kind like Membrane's kinds, so that a NetworkPolicy
// and a CiliumNetworkPolicy of one name are two policies, as in Cilium.
// (Documents of those kinds given through PUT /v1/policy keep KeyOf.)
func KeyOfObject(kind, namespace, name string) string {
	return kind + ":" + namespace + "/" + name
}

// KeyOf is the unique name of a policy: "namespace/name" ("/name" for a
// cluster-wide one, whose namespace is ""), prefixed with "<kind>:" for
// Membrane's own kinds, so that a NetworkPolicy and a
// MembraneNetworkPolicy of one name are two policies (as Cilium keeps a
// NetworkPolicy and a CiliumNetworkPolicy apart). CiliumNetworkPolicy and
// NetworkPolicy documents of one name replace each other, as they always
// did through PUT /v1/policy.
func KeyOf(kind, namespace, name string) string {
	if kind == KindMNP || kind == KindMCNP {
		return kind + ":" + namespace + "/" + name
	}
	return namespace + "/" + name
}

// Clusterwide reports whether kind is a cluster-wide CNP-shaped kind.
func Clusterwide(kind string) bool { return kind == KindCCNP || kind == KindMCNP }

// maxDocuments bounds the documents of one import.
const maxDocuments = 10000

// Parse parses YAML or JSON policy documents: YAML documents separated
// by "---", a JSON object or list, or a List kind with items. Every
// document must parse; the first error names the document and the field.
//
// Returns an error wrapping ErrInvalidPolicy if a document is malformed,
// of an unsupported kind, or uses a field this agent does not support.
func Parse(data []byte) ([]*Policy, error) { return ParseWith(data, ParseOptions{}) }

// ParseOptions tune how documents compile.
type ParseOptions struct {
	// NamespaceLabels lets a NetworkPolicy's namespaceSelector match any
	// namespace label (Kubernetes mode, where endpoints carry their
	// namespace's labels under NamespaceLabelsPrefix). Without it only
	// kubernetes.io/metadata.name is accepted.
	NamespaceLabels bool
	// PartialRefusal keeps a document one of whose ingress or egress
	// entries the agent refuses: that entry (or, for a field restricting
	// the other entries, the rule's direction) allows nothing, the rest
	// stays in force and Policy.Refused says what was refused
	// (refuse.go). For documents the agent must enforce whatever they
	// hold (Kubernetes objects): refusing the whole document would leave
	// the pods it selects unisolated. Without it (PUT /v1/policy, whose
	// caller sees the error) any refusal refuses the document.
	PartialRefusal bool
	// NoL7 refuses toPorts[].rules.http (no L7 proxy runs) and
	// NoDNSProxy toFQDNs and toPorts[].rules.dns (no DNS proxy runs) as
	// fields the agent cannot enforce.
	NoL7, NoDNSProxy bool
	// NodeSelectorLabels accepts fromNodes and toNodes
	// (--enable-node-selector-labels: other nodes have identities of
	// their own, with their Node labels). Without it they are refused as
	// fields the agent cannot enforce, naming the flag.
	NodeSelectorLabels bool
	// SecretsNamespace is the one namespace whose Secrets headerMatches
	// may name (--policy-secrets-namespace, Kubernetes mode): a secret
	// elsewhere is refused, never read. "" (standalone and kvstore modes,
	// where the agent reads no Secrets) refuses every secret.
	SecretsNamespace string
}

// ParseWith is Parse with options.
func ParseWith(data []byte, opts ParseOptions) ([]*Policy, error) {
	objs, err := splitDocuments(data)
	if err != nil {
		return nil, fmt.Errorf("parse policy: %w: %w", ErrInvalidPolicy, err)
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("parse policy: no policy documents: %w", ErrInvalidPolicy)
	}
	if len(objs) > maxDocuments {
		return nil, fmt.Errorf("parse policy: %d documents, more than %d: %w", len(objs), maxDocuments, ErrInvalidPolicy)
	}
	out := make([]*Policy, 0, len(objs))
	seen := make(map[string]int, len(objs))
	for i, obj := range objs {
		p, err := parseObject(obj, opts)
		if err != nil {
			return nil, fmt.Errorf("parse policy: document %d%s: %w: %w", i+1, describe(obj), ErrInvalidPolicy, err)
		}
		if j, dup := seen[p.Key()]; dup {
			return nil, fmt.Errorf("parse policy: document %d: %s %s is also document %d: %w", i+1, p.Kind, p.Key(), j+1, ErrInvalidPolicy)
		}
		seen[p.Key()] = i
		out = append(out, p)
	}
	return out, nil
}

// describe names a document for errors: " (Kind ns/name)" when known.
func describe(obj map[string]any) string {
	kind, _ := obj["kind"].(string)
	md, _ := obj["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	ns, _ := md["namespace"].(string)
	if kind == "" && name == "" {
		return ""
	}
	if ns == "" {
		ns = DefaultNamespace
	}
	return fmt.Sprintf(" (%s %s/%s)", kind, ns, name)
}

// splitDocuments turns the input into JSON objects.
func splitDocuments(data []byte) ([]map[string]any, error) {
	trimmed := bytes.TrimSpace(data)
	var values []any
	if len(trimmed) > 0 && (trimmed[0] == '{' || trimmed[0] == '[') {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.UseNumber()
		for {
			var v any
			err := dec.Decode(&v)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("malformed JSON: %w", err)
			}
			values = append(values, v)
		}
	} else {
		for i, doc := range splitYAML(data) {
			js, err := yaml.YAMLToJSON(doc)
			if err != nil {
				return nil, fmt.Errorf("document %d: malformed YAML: %w", i+1, err)
			}
			if s := bytes.TrimSpace(js); len(s) == 0 || string(s) == "null" {
				continue
			}
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
			values = append(values, v)
		}
	}
	var objs []map[string]any
	for _, v := range values {
		var err error
		if objs, err = appendObjects(objs, v); err != nil {
			return nil, err
		}
	}
	return objs, nil
}

// appendObjects flattens lists and List kinds into objects.
func appendObjects(objs []map[string]any, v any) ([]map[string]any, error) {
	switch t := v.(type) {
	case []any:
		for _, item := range t {
			var err error
			if objs, err = appendObjects(objs, item); err != nil {
				return nil, err
			}
		}
		return objs, nil
	case map[string]any:
		if k, _ := t["kind"].(string); k == "List" {
			items, ok := t["items"].([]any)
			if !ok {
				return nil, fmt.Errorf("kind List: \"items\" must be a list")
			}
			return appendObjects(objs, items)
		}
		return append(objs, t), nil
	}
	return nil, fmt.Errorf("document %d: want an object, got %s", len(objs)+1, jsonType(v))
}

func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	}
	return "an object"
}

// splitYAML splits a YAML stream at "---" document separators.
func splitYAML(data []byte) [][]byte {
	var docs [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(data, []byte("\n")) {
		t := bytes.TrimRight(line, " \t\r\n")
		if bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			docs = append(docs, cur)
			cur = nil
			if rest := bytes.TrimSpace(t[3:]); len(rest) > 0 && rest[0] != '#' {
				cur = append(cur, rest...) // "--- {kind: ...}"
				cur = append(cur, '\n')
			}
			continue
		}
		cur = append(cur, line...)
	}
	return append(docs, cur)
}

// parseObject decodes and compiles one document.
func parseObject(obj map[string]any, opts ParseOptions) (*Policy, error) {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var (
		doc  any
		spec any
	)
	switch {
	case (kind == KindCNP || kind == KindCCNP) && apiVersion == APIVersionCNP,
		(kind == KindMNP || kind == KindMCNP) && apiVersion == APIVersionMembrane:
		doc = &cnpDoc{}
		spec = obj["spec"]
		if spec == nil {
			spec = obj["specs"]
		}
	case kind == KindKNP && apiVersion == APIVersionKNP:
		doc = &knpDoc{}
		spec = obj["spec"]
	default:
		return nil, fmt.Errorf("unsupported kind %q apiVersion %q (want %s or %s %s, %s or %s %s, or %s %s)",
			kind, apiVersion, KindCNP, KindCCNP, APIVersionCNP, KindMNP, KindMCNP, APIVersionMembrane, KindKNP, APIVersionKNP)
	}
	rf := &refusals{partial: opts.PartialRefusal}
	if err := rf.sortUnknown(checkFields(obj, reflect.TypeOf(doc).Elem(), "", nil)); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, doc); err != nil {
		return nil, describeJSONError(err)
	}
	specRaw, _ := json.Marshal(spec)
	var p *Policy
	switch d := doc.(type) {
	case *cnpDoc:
		p, err = compileCNP(d, kind, specRaw, opts, rf)
	default:
		p, err = compileKNP(doc.(*knpDoc), specRaw, opts, rf)
	}
	if err == nil {
		err = rf.unconsumed()
	}
	if err != nil {
		return nil, err
	}
	p.Raw = raw
	p.Refused = rf.list
	return p, nil
}

func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("field %q: want %s, got JSON %s", te.Field, te.Type, te.Value)
	}
	return err
}

var portValueType = reflect.TypeOf(portValue{})

// checkFields returns the path of every key of v that the Go type t
// does not declare ("spec.ingress[0].toPorts[0].rules"), in document
// order (keys sorted), appended to out.
func checkFields(v any, t reflect.Type, path string, out []string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		if t == portValueType {
			return out
		}
		m, ok := v.(map[string]any)
		if !ok {
			return out // a type error, reported by the decoder
		}
		fields := structFields(t)
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, ok := fields[k]
			if !ok {
				out = append(out, join(path, k))
				continue
			}
			out = checkFields(m[k], ft, join(path, k), out)
		}
	case reflect.Slice:
		l, ok := v.([]any)
		if !ok {
			return out
		}
		for i, item := range l {
			out = checkFields(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	}
	return out
}

func join(path, k string) string {
	if path == "" {
		return k
	}
	return path + "." + k
}

// fieldsByType caches structFields per document type (a few fixed
// types; a large list of objects would otherwise rebuild the map per
// element).
var fieldsByType sync.Map // reflect.Type -> map[string]reflect.Type

// structFields maps the JSON names of t's fields (embedded structs
// flattened) to their types. The map is shared: read only.
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldsByType.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := buildStructFields(t)
	fieldsByType.Store(t, m)
	return m
}

func buildStructFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			for k, v := range structFields(f.Type) {
				out[k] = v
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = f.Type
		}
	}
	return out
}
