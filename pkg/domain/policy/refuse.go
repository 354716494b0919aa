package policy

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// A document the agent must enforce whatever it contains (a Kubernetes
// object: nobody sees a refusal when it is written) is compiled with
// ParseOptions.PartialRefusal. Then a part the agent refuses (an
// invalid port name, L7 rules without a proxy, a field it does not know) makes only
// that part contribute nothing, and the rest stays in force: the
// subject stays isolated in its directions (deny what cannot be
// allowed), as Kubernetes requires of a pod selected by any policy.
// Entries of one direction are alternatives (allows that add up), so
// dropping one can only narrow what is allowed. Parts that narrow other
// entries (deny rules, fromRequires/toRequires) cannot be dropped
// alone: they refuse their rule's whole direction, which then allows
// nothing (the subject stays isolated in it). A refusal outside any
// entry (the subject, policyTypes, metadata, an unknown top-level
// field) still refuses the whole document: without an understood
// subject and directions there is nothing to isolate.

// Refusal is a part of a policy the agent refused while keeping the rest
// in force: the part allows nothing.
type Refusal struct {
	// Path is the refused part: an ingress or egress entry
	// ("spec.ingress[1]", "specs[0].egress[2]"), or a rule's whole
	// direction ("spec.ingress") when the refused field restricts the
	// other entries.
	Path string
	// Reason names the refused field and why ("spec.ingress[1].ports[0].endPort:
	// needs a numeric port, not the named port \"http\"").
	Reason string
}

// String says what was refused and what it means.
func (r Refusal) String() string {
	return fmt.Sprintf("%s allows nothing: %s", r.Path, r.Reason)
}

// refusals collects the refusals of one document being compiled.
type refusals struct {
	// partial is ParseOptions.PartialRefusal: without it the first
	// refusal refuses the document.
	partial bool
	// pre are the refusals checkFields found (unknown fields), by the
	// part they refuse.
	pre map[string][]string
	// list is what compile refused, in document order.
	list []Refusal
}

// refuse records err as the refusal of the part at path and reports
// whether compiling goes on without the part (partial mode).
func (rf *refusals) refuse(path string, err error) bool {
	if rf == nil || !rf.partial {
		return false
	}
	rf.list = append(rf.list, Refusal{Path: path, Reason: err.Error()})
	return true
}

// refused reports whether checkFields refused the part at path, and
// records it.
func (rf *refusals) refused(path string) bool {
	if rf == nil || len(rf.pre[path]) == 0 {
		return false
	}
	rf.list = append(rf.list, Refusal{Path: path, Reason: strings.Join(rf.pre[path], "; ")})
	delete(rf.pre, path)
	return true
}

// unconsumed returns the error refusing the document when checkFields
// refused a part compile never looked at: nothing is silently ignored.
func (rf *refusals) unconsumed() error {
	for _, part := range slices.Sorted(maps.Keys(rf.pre)) {
		return errors.New(rf.pre[part][0])
	}
	return nil
}

var (
	// entryField is an unknown field inside one ingress or egress entry.
	entryField = regexp.MustCompile(`^((?:spec|specs\[\d+\])\.(?:ingress|egress)\[\d+\])(?:\.([A-Za-z]+))?`)
	// denyField is an unknown field in or under a deny section.
	denyField = regexp.MustCompile(`^((?:spec|specs\[\d+\])\.(?:ingress|egress))Deny(?:$|[.\[])`)
)

// narrowing are the entry fields that restrict the other entries of
// their direction (Cilium's fromRequires/toRequires): refused, they
// refuse the whole direction.
var narrowing = map[string]bool{"fromRequires": true, "toRequires": true}

// refusedPart returns the part of a document an unknown field at path
// refuses (an entry, or a rule's direction), or false when it is
// outside any (the document is refused).
func refusedPart(path string) (string, bool) {
	if m := denyField.FindStringSubmatch(path); m != nil {
		return m[1], true
	}
	if m := entryField.FindStringSubmatch(path); m != nil {
		if narrowing[m[2]] {
			return m[1][:strings.LastIndexByte(m[1], '[')], true
		}
		return m[1], true
	}
	return "", false
}

// unsupportedWhy says why the agent refuses a field Cilium knows, by
// its last path element.
var unsupportedWhy = map[string]string{
	"l7proto": "generic L7 parsers (l7proto/l7) are not supported: Membrane's proxy parses HTTP (HTTP/2, gRPC), Kafka and DNS only",
}

// unsupported is the refusal message of the unknown field at path p,
// with the reason when the field is one the agent knows it refuses.
func unsupported(p string) string {
	msg := fmt.Sprintf("unsupported field %q", p)
	last := p[strings.LastIndexByte(p, '.')+1:]
	if why, ok := unsupportedWhy[last]; ok {
		msg += " (" + why + ")"
	}
	return msg
}

// sortUnknown puts the unknown fields checkFields found into rf.pre, or
// returns the error refusing the document: the first unknown field
// outside any entry, or the first of all without partial mode.
func (rf *refusals) sortUnknown(unknown []string) error {
	for _, p := range unknown {
		part, ok := refusedPart(p)
		if !rf.partial || !ok {
			return errors.New(unsupported(p))
		}
		if rf.pre == nil {
			rf.pre = map[string][]string{}
		}
		rf.pre[part] = append(rf.pre[part], unsupported(p))
	}
	return nil
}

// Partial reports whether the agent refused parts of p (which are not
// in force) while enforcing the rest.
func (p *Policy) Partial() bool { return len(p.Refused) > 0 }

// RefusedSummary joins the refusals into one line ("" when none).
func (p *Policy) RefusedSummary() string {
	s := make([]string, len(p.Refused))
	for i, r := range p.Refused {
		s[i] = r.String()
	}
	return strings.Join(s, "; ")
}
