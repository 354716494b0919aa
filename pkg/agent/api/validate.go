package api

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"unicode"
	"unicode/utf8"

	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/ipam"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// Limits on request fields. Every string of a request is valid UTF-8
// (path, query and body alike): invalid bytes are refused, never coerced
// to U+FFFD, so two requests that print alike name the same thing.
const (
	// maxLabels bounds the labels of one endpoint (PUT) and of one PATCH's
	// add or delete list.
	maxLabels = 256
	// maxTextField bounds free-text fields (container-name, k8s-uid).
	maxTextField = 253
	// maxNetnsPath bounds the netns path (PATH_MAX without the NUL).
	maxNetnsPath = 4095
	// maxOwner bounds an IPAM owner (query parameter "owner").
	maxOwner = 512
)

// checkRequest refuses, before routing, a request the mux would redirect
// or whose path or query is not valid UTF-8.
func checkRequest(r *http.Request) error {
	if err := checkPath(r); err != nil {
		return err
	}
	return checkRequestText(r)
}

// checkRequestText refuses a request whose path or query is not valid
// UTF-8 once unescaped.
func checkRequestText(r *http.Request) error {
	if !utf8.ValidString(r.URL.Path) {
		return badRequest(fmt.Sprintf("path %q is not valid UTF-8", labels.Clip(r.URL.Path)))
	}
	if r.URL.RawQuery == "" {
		return nil
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return badRequest(fmt.Sprintf("query %q: %v", labels.Clip(r.URL.RawQuery), err))
	}
	for key, vals := range q {
		if !utf8.ValidString(key) {
			return badRequest(fmt.Sprintf("query parameter %q is not valid UTF-8", labels.Clip(key)))
		}
		for _, v := range vals {
			if !utf8.ValidString(v) {
				return badRequest(fmt.Sprintf("query parameter %q: %q is not valid UTF-8", labels.Clip(key), labels.Clip(v)))
			}
		}
	}
	return nil
}

// checkPath refuses a path that the mux would redirect (a "." or ".."
// element, "//"): the API answers JSON, never a redirect.
func checkPath(r *http.Request) error {
	p := r.URL.Path
	if p == "" || p[0] != '/' {
		return badRequest(fmt.Sprintf("path %q does not start with '/'", labels.Clip(p)))
	}
	clean := path.Clean(p)
	if p[len(p)-1] == '/' && clean != "/" {
		clean += "/"
	}
	if clean != p {
		return badRequest(fmt.Sprintf("path %q is not in canonical form (want %q)", labels.Clip(p), labels.Clip(clean)))
	}
	return nil
}

// checkText refuses a field that is longer than max bytes, not valid
// UTF-8 or holds a control character (NUL, ESC, DEL, C1 controls).
func checkText(field, v string, max int) error {
	if len(v) > max {
		return badRequest(fmt.Sprintf("field %q: %d bytes, longer than %d", field, len(v), max))
	}
	if !utf8.ValidString(v) {
		return badRequest(fmt.Sprintf("field %q: %q is not valid UTF-8", field, labels.Clip(v)))
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return badRequest(fmt.Sprintf("field %q: %q contains control character %U", field, labels.Clip(v), r))
		}
	}
	return nil
}

// checkNetns refuses a netns that is not an absolute, clean path without
// control characters.
func checkNetns(v string) error {
	if v == "" {
		return nil
	}
	if err := checkText("netns", v, maxNetnsPath); err != nil {
		return err
	}
	if !path.IsAbs(v) || path.Clean(v) != v {
		return badRequest(fmt.Sprintf("field \"netns\": %q is not an absolute, clean path", labels.Clip(v)))
	}
	return nil
}

// checkOwner refuses an IPAM owner that is too long, not valid UTF-8 or
// holds a control character or space.
func checkOwner(v string) error {
	if len(v) > maxOwner {
		return badRequest(fmt.Sprintf("query parameter \"owner\": longer than %d bytes", maxOwner))
	}
	if !utf8.ValidString(v) {
		return badRequest(fmt.Sprintf("query parameter \"owner\": %q is not valid UTF-8", labels.Clip(v)))
	}
	for _, r := range v {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return badRequest(fmt.Sprintf("query parameter \"owner\": %q contains a space or control character %U", labels.Clip(v), r))
		}
	}
	return nil
}

// apiLabels parses labels given through the API: at most maxLabels, each
// valid, none of source reserved. Only the agent assigns reserved labels
// (the health endpoint's reserved:health): a reserved label from a client
// would give its pod the host's, world's or health's identity.
func apiLabels(field string, raw []string) (labels.Labels, error) {
	if len(raw) > maxLabels {
		return nil, badRequest(fmt.Sprintf("field %q: %d labels, more than %d", field, len(raw), maxLabels))
	}
	ls, err := labels.ParseSet(raw)
	if err != nil {
		return nil, badRequest(fmt.Sprintf("field %q: %v", field, err))
	}
	for _, l := range ls {
		if l.Source == labels.SourceReserved {
			return nil, badRequest(fmt.Sprintf("field %q: label %q: source %q is assigned by the agent only", field, l.String(), labels.SourceReserved))
		}
	}
	return ls, nil
}

// agentManaged reports whether ep carries a reserved label, i.e. the agent
// created it (the health endpoint); its labels are not changed through the API.
func agentManaged(ep *endpoint.Endpoint) bool {
	for _, l := range ep.Labels {
		if l.Source == labels.SourceReserved {
			return true
		}
	}
	return false
}

// checkRanges refuses an address outside the configured ranges or
// reserved in them (network, gateway, broadcast), before the endpoint is
// created: a non-sync PUT answers before the endpoint claims its
// addresses, so a claim failing afterwards would remove an endpoint
// already acknowledged.
func (s *Server) checkRanges(spec *endpoint.Endpoint) error {
	for _, a := range []struct {
		field string
		fam   ipam.Family
		ip    netip.Addr
	}{{"addressing.ipv4", ipam.IPv4, spec.IPv4}, {"addressing.ipv6", ipam.IPv6, spec.IPv6}} {
		if !a.ip.IsValid() {
			continue
		}
		rg := s.ranges[a.fam]
		if rg == nil {
			return &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("field %q: %s: no %s range configured", a.field, a.ip, a.fam)}
		}
		if err := rg.Check(a.ip); err != nil {
			return &apiError{http.StatusBadRequest, CodeInvalidAddress, fmt.Sprintf("field %q: %v", a.field, err)}
		}
	}
	return nil
}
