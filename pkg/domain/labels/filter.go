package labels

import (
	"fmt"
	"regexp"
	"strings"
)

// Identity-relevant labels, as Cilium's labelsfilter decides them: a
// Filter is a list of patterns "[source:][!]regexp"; the regexp is
// anchored at the start of the label key (so "app" also matches
// "app-x"), the source ("any" when absent) limits the pattern to labels
// of that source, and "!" makes it an exclusion. A label is kept when
// the longest include pattern matching it is longer than the shortest
// exclude pattern matching it, or, when the operator gave no include
// pattern, when no exclude pattern matches it. Reserved labels are
// always kept.

// DefaultFilterPatterns are the patterns every Filter starts with:
// Cilium's defaults (the namespace, namespace labels and
// app.kubernetes.io kept; io.kubernetes, kubernetes.io, k8s.io and
// per-rollout hashes left out) plus the per-pod labels of Jobs,
// StatefulSets and indexed workloads, and Membrane's service account
// label kept.
var DefaultFilterPatterns = []string{
	`any:io\.kubernetes\.pod\.namespace`,
	`any:io\.cilium\.k8s\.namespace\.labels`,
	`any:io\.cilium\.k8s\.policy`,
	`any:app\.kubernetes\.io`,
	`any:!io\.kubernetes`,
	`any:!kubernetes\.io`,
	`any:!beta\.kubernetes\.io`,
	`any:!k8s\.io`,
	`any:!statefulset\.kubernetes\.io/pod-name`,
	`any:!apps\.kubernetes\.io/pod-index`,
	`any:!batch\.kubernetes\.io/job-name`,
	`any:!batch\.kubernetes\.io/controller-uid`,
	`any:!batch\.kubernetes\.io/job-completion-index`,
	`any:!pod-template-generation`,
	`any:!pod-template-hash`,
	`any:!controller-revision-hash`,
	`any:!controller-uid`,
	`any:!job-name`,
	`any:!annotation\.`,
	`any:!etcd_node`,
}

// maxFilterPatterns and maxPatternLen bound what an operator may give.
const (
	maxFilterPatterns = 256
	maxPatternLen     = 512
)

// Filter chooses the identity-relevant labels. The zero value keeps
// every label; build one with NewFilter.
type Filter struct {
	patterns []filterPattern
	// includes: the operator gave at least one include pattern (then a
	// label nothing includes is left out).
	includes bool
}

type filterPattern struct {
	source  string
	exclude bool
	re      *regexp.Regexp
	text    string
}

// NewFilter returns the filter of DefaultFilterPatterns followed by
// patterns (the agent's --labels). Returns an error naming the first
// pattern that does not parse.
func NewFilter(patterns []string) (*Filter, error) { return newFilter(DefaultFilterPatterns, patterns) }

// NewPatternFilter returns the filter of patterns alone, without
// DefaultFilterPatterns (the agent's --node-labels): with none it keeps
// every label.
func NewPatternFilter(patterns []string) (*Filter, error) { return newFilter(nil, patterns) }

func newFilter(defaults, patterns []string) (*Filter, error) {
	if len(patterns) > maxFilterPatterns {
		return nil, fmt.Errorf("label filter: %d patterns, more than %d", len(patterns), maxFilterPatterns)
	}
	f := &Filter{}
	for _, p := range defaults {
		fp, err := parseFilterPattern(p)
		if err != nil {
			return nil, fmt.Errorf("default label pattern %q: %w", p, err) // a bug
		}
		f.patterns = append(f.patterns, fp)
	}
	for _, p := range patterns {
		fp, err := parseFilterPattern(p)
		if err != nil {
			return nil, fmt.Errorf("label pattern %q: %w", Clip(p), err)
		}
		if !fp.exclude {
			f.includes = true
		}
		f.patterns = append(f.patterns, fp)
	}
	return f, nil
}

// parseFilterPattern parses "[source:][!]regexp".
func parseFilterPattern(s string) (filterPattern, error) {
	if len(s) > maxPatternLen {
		return filterPattern{}, fmt.Errorf("longer than %d bytes", maxPatternLen)
	}
	p := filterPattern{source: SourceAny, text: s}
	if i := strings.IndexByte(s, ':'); i > 0 && validateSource(s[:i]) == nil {
		p.source, s = s[:i], s[i+1:]
	}
	if rest, ok := strings.CutPrefix(s, "!"); ok {
		p.exclude, s = true, rest
	}
	if s == "" {
		return filterPattern{}, fmt.Errorf("empty pattern")
	}
	re, err := regexp.Compile(`^(?:` + s + `)`)
	if err != nil {
		return filterPattern{}, fmt.Errorf("not a regular expression: %w", err)
	}
	p.re = re
	return p, nil
}

// matchLen returns the length of p's match at the start of l's key (0:
// no match; an empty match counts as 1, it still matched).
func (p *filterPattern) matchLen(l Label) int {
	if p.source != SourceAny && p.source != l.Source {
		return 0
	}
	loc := p.re.FindStringIndex(l.Key)
	if loc == nil {
		return 0
	}
	return max(loc[1], 1)
}

// Relevant reports whether l is an identity-relevant label.
func (f *Filter) Relevant(l Label) bool {
	if f == nil || l.Source == SourceReserved {
		return true
	}
	included, ignored := 0, 0
	for i := range f.patterns {
		p := &f.patterns[i]
		n := p.matchLen(l)
		switch {
		case n == 0:
		case p.exclude:
			if ignored == 0 || n < ignored {
				ignored = n
			}
		default:
			included = max(included, n)
		}
	}
	if included > ignored {
		return true
	}
	return ignored == 0 && !f.includes
}

// Apply returns the identity-relevant labels of ls and those it left
// out (ls when nothing is left out).
func (f *Filter) Apply(ls Labels) (kept, dropped Labels) {
	if f == nil {
		return ls, nil
	}
	for i, l := range ls {
		if f.Relevant(l) {
			if dropped != nil {
				kept = append(kept, l)
			}
			continue
		}
		if dropped == nil {
			kept = append(make(Labels, 0, len(ls)), ls[:i]...)
		}
		dropped = append(dropped, l)
	}
	if dropped == nil {
		return ls, nil
	}
	return kept, dropped
}

// Patterns returns the filter's patterns, defaults first.
func (f *Filter) Patterns() []string {
	if f == nil {
		return nil
	}
	out := make([]string, len(f.patterns))
	for i, p := range f.patterns {
		out[i] = p.text
	}
	return out
}
