package flows

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/models"
)

// ErrBadFilter is wrapped by ParseFilter's errors, each naming the bad
// field.
var ErrBadFilter = errors.New("bad flow filter")

// Verdicts are the flow verdicts a filter may name: "translated" selects
// the flows a Service translated, whatever their verdict.
var Verdicts = []string{"forwarded", "redirected", "dropped", "audit", "translated", "allowed", "denied", "error"}

// Protocols are the protocol names a filter may name.
var Protocols = []string{"tcp", "udp", "sctp", "icmp", "icmpv6"}

// Filter selects flows. Each non-empty field must match (AND); the values
// within one field are alternatives (OR).
type Filter struct {
	// FromPod and ToPod are "[namespace/]pod" (namespace "default" when
	// absent); the pod name matches as a prefix, as in Hubble.
	FromPod, ToPod []string
	// FromLabel and ToLabel are labels of the source or destination
	// identity: "key=value", "key" (present) or "source:key=value".
	FromLabel, ToLabel []string
	// Namespace matches either side's namespace.
	Namespace []string
	// Verdict is one of Verdicts.
	Verdict []string
	// Protocol is one of Protocols.
	Protocol []string
	// Port matches either side's port.
	Port []uint16
	// Since keeps flows at or after this time.
	Since time.Time
	// Last keeps the last N matching flows (0: all the ring holds).
	Last int
	// Follow streams new flows after the stored ones.
	Follow bool
}

// filterKeys are the query parameters ParseFilter reads.
var filterKeys = []string{"from-pod", "to-pod", "from-label", "to-label", "namespace", "verdict", "protocol", "port", "since", "last", "follow"}

// ParseFilter parses GET /v1/flows' query. Repeated parameters and
// comma-separated values are alternatives. now is the reference of a
// relative since ("5m": the last five minutes). Returns an error wrapping
// ErrBadFilter naming the parameter for anything it does not accept.
func ParseFilter(q url.Values, now time.Time) (Filter, error) {
	var f Filter
	for key := range q {
		if !slices.Contains(filterKeys, key) {
			return f, fmt.Errorf("%w: unknown query parameter %q (want %s)", ErrBadFilter, key, strings.Join(filterKeys, ", "))
		}
	}
	var err error
	for _, p := range []struct {
		key   string
		dst   *[]string
		check func(string) error
	}{
		{"from-pod", &f.FromPod, checkPod}, {"to-pod", &f.ToPod, checkPod},
		{"from-label", &f.FromLabel, checkLabel}, {"to-label", &f.ToLabel, checkLabel},
		{"namespace", &f.Namespace, checkNamespace},
		{"verdict", &f.Verdict, oneOf(Verdicts)}, {"protocol", &f.Protocol, oneOf(Protocols)},
	} {
		if *p.dst, err = values(q, p.key, p.check); err != nil {
			return f, err
		}
	}
	for i, v := range f.Protocol {
		f.Protocol[i] = strings.ToLower(v)
	}
	for i, v := range f.FromPod {
		f.FromPod[i] = withNamespace(v)
	}
	for i, v := range f.ToPod {
		f.ToPod[i] = withNamespace(v)
	}
	ports, err := values(q, "port", func(v string) error {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil || n == 0 {
			return errors.New("want a port number from 1 to 65535")
		}
		return nil
	})
	if err != nil {
		return f, err
	}
	for _, v := range ports {
		n, _ := strconv.ParseUint(v, 10, 16)
		f.Port = append(f.Port, uint16(n))
	}
	if v, ok, err := single(q, "since"); err != nil {
		return f, err
	} else if ok {
		if f.Since, err = parseSince(v, now); err != nil {
			return f, fmt.Errorf("%w: query parameter \"since\": %q: %v", ErrBadFilter, v, err)
		}
	}
	if v, ok, err := single(q, "last"); err != nil {
		return f, err
	} else if ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return f, fmt.Errorf("%w: query parameter \"last\": %q: want a positive number of flows", ErrBadFilter, v)
		}
		f.Last = n
	}
	if v, ok, err := single(q, "follow"); err != nil {
		return f, err
	} else if ok {
		if f.Follow, err = strconv.ParseBool(v); err != nil {
			return f, fmt.Errorf("%w: query parameter \"follow\": %q: want true or false", ErrBadFilter, v)
		}
	}
	return f, nil
}

// values splits key's values at commas and checks each.
func values(q url.Values, key string, check func(string) error) ([]string, error) {
	var out []string
	for _, raw := range q[key] {
		for _, v := range strings.Split(raw, ",") {
			v = strings.TrimSpace(v)
			if err := check(v); err != nil {
				return nil, fmt.Errorf("%w: query parameter %q: %q: %v", ErrBadFilter, key, v, err)
			}
			out = append(out, v)
		}
	}
	return out, nil
}

// single returns key's only value.
func single(q url.Values, key string) (string, bool, error) {
	vs, ok := q[key]
	if !ok {
		return "", false, nil
	}
	if len(vs) != 1 {
		return "", false, fmt.Errorf("%w: query parameter %q given %d times, want once", ErrBadFilter, key, len(vs))
	}
	return vs[0], true, nil
}

func parseSince(v string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return time.Time{}, errors.New("want a positive duration")
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errors.New("want an RFC 3339 time or a duration (5m)")
	}
	return t, nil
}

func oneOf(set []string) func(string) error {
	return func(v string) error {
		if !slices.Contains(set, strings.ToLower(v)) {
			return fmt.Errorf("want one of %s", strings.Join(set, ", "))
		}
		return nil
	}
}

// checkNamespace accepts a Kubernetes namespace name (an RFC 1123 label).
func checkNamespace(v string) error {
	if v == "" || len(v) > 63 || !dnsLabel(v) {
		return errors.New("want a namespace name (lower-case letters, digits and '-', at most 63)")
	}
	return nil
}

// checkPod accepts "[namespace/]pod".
func checkPod(v string) error {
	ns, pod, found := strings.Cut(v, "/")
	if !found {
		ns, pod = "default", v
	}
	if err := checkNamespace(ns); err != nil {
		return err
	}
	if pod == "" || len(pod) > 253 || strings.ContainsAny(pod, "/ \t") {
		return errors.New("want [namespace/]pod")
	}
	return nil
}

// checkLabel accepts "key", "key=value" and "source:key=value".
func checkLabel(v string) error {
	key, val, _ := strings.Cut(v, "=")
	if _, k, ok := strings.Cut(key, ":"); ok {
		key = k
	}
	if key == "" || len(key) > 317 || len(val) > 63 || strings.ContainsAny(v, " \t\"") {
		return errors.New("want key, key=value or source:key=value")
	}
	return nil
}

func dnsLabel(v string) bool {
	for i, c := range v {
		ok := c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' && i > 0 && i < len(v)-1
		if !ok {
			return false
		}
	}
	return true
}

func withNamespace(v string) string {
	if strings.Contains(v, "/") {
		return v
	}
	return "default/" + v
}

// Match reports whether fl passes f (Last and Follow apart).
func (f *Filter) Match(fl *models.Flow) bool {
	switch {
	case !f.Since.IsZero() && fl.Time.Before(f.Since):
		return false
	case len(f.FromPod) > 0 && !podMatch(f.FromPod, &fl.Source):
		return false
	case len(f.ToPod) > 0 && !podMatch(f.ToPod, &fl.Destination):
		return false
	case len(f.FromLabel) > 0 && !labelMatch(f.FromLabel, fl.Source.Labels):
		return false
	case len(f.ToLabel) > 0 && !labelMatch(f.ToLabel, fl.Destination.Labels):
		return false
	case len(f.Namespace) > 0 && !slices.Contains(f.Namespace, fl.Source.Namespace) && !slices.Contains(f.Namespace, fl.Destination.Namespace):
		return false
	case len(f.Verdict) > 0 && !verdictMatch(f.Verdict, fl):
		return false
	case len(f.Protocol) > 0 && !slices.Contains(f.Protocol, strings.ToLower(fl.Protocol)):
		return false
	case len(f.Port) > 0 && !slices.Contains(f.Port, fl.Source.Port) && !slices.Contains(f.Port, fl.Destination.Port):
		return false
	}
	return true
}

func podMatch(want []string, p *models.FlowPeer) bool {
	if p.Pod == "" {
		return false
	}
	for _, w := range want {
		ns, pod, _ := strings.Cut(w, "/")
		if p.Namespace == ns && strings.HasPrefix(p.Pod, pod) {
			return true
		}
	}
	return false
}

func labelMatch(want, have []string) bool {
	for _, w := range want {
		for _, l := range have {
			if l == w {
				return true
			}
			_, kv, _ := strings.Cut(l, ":") // "source:key=value"
			key, _, _ := strings.Cut(kv, "=")
			if kv == w || key == w {
				return true
			}
		}
	}
	return false
}

func verdictMatch(want []string, fl *models.Flow) bool {
	for _, w := range want {
		w = strings.ToLower(w)
		if w == fl.Verdict || w == "translated" && fl.Service != "" {
			return true
		}
	}
	return false
}
