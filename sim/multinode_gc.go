package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// etcdIdentities is the identities directory as read from etcd (the
// layout of pkg/agent/kvstore's keys.go).
type etcdIdentities struct {
	ids    map[identity.NumericIdentity]string // id/<N> -> labels key
	labels map[string]string                   // labels/<key> -> N as written
	refs   map[string][]string                 // refs/<hash>/ -> nodes
}

// checkEtcdIdentities checks etcd's identities against the nodes' live
// endpoints (used: node -> labels key -> identity; states, for the
// messages, the states of every endpoint holding one): every identity an
// endpoint holds is in etcd with its number and the node's reference;
// every reference belongs to a node with a live endpoint of that label
// set; every identity has a reference (once the GC's grace has passed,
// an unreferenced one must be gone); id/ and labels/ keys come in pairs.
// It returns the violations and the number of identities in etcd.
func checkEtcdIdentities(ctx context.Context, cli *clientv3.Client, used map[string]map[string]identity.NumericIdentity,
	states map[string]map[string][]string) ([]string, int, error) {
	st, err := readEtcdIdentities(ctx, cli)
	if err != nil {
		return nil, 0, err
	}
	var v []string
	for node, sets := range used {
		for lk, n := range sets {
			switch {
			case st.ids[n] != lk:
				v = append(v, fmt.Sprintf("etcd: identity %d (%s) held by %s's endpoints is not in etcd (id/%d is %q)", n, lk, node, n, st.ids[n]))
			case !slices.Contains(st.refs[refHash(lk)], node):
				v = append(v, fmt.Sprintf("etcd: %s's endpoints hold identity %d (%s) without a reference", node, n, lk))
			}
		}
	}
	hashes := map[string]string{}
	for n, lk := range st.ids {
		hashes[refHash(lk)] = lk
		if len(st.refs[refHash(lk)]) == 0 {
			v = append(v, fmt.Sprintf("etcd: identity %d (%s) has no reference and outlived the GC's grace", n, lk))
		}
		if st.labels[lk] != strconv.FormatUint(uint64(n), 10) {
			v = append(v, fmt.Sprintf("etcd: identity %d (%s): labels/ key says %q", n, lk, st.labels[lk]))
		}
	}
	for lk, n := range st.labels {
		if _, ok := hashes[refHash(lk)]; !ok {
			v = append(v, fmt.Sprintf("etcd: labels/%s -> %s without its id/ key", lk, n))
		}
	}
	for h, nodes := range st.refs {
		for _, node := range nodes {
			if lk, ok := hashes[h]; !ok || used[node][lk] == 0 {
				v = append(v, fmt.Sprintf("etcd: %s holds a reference (refs/%s, labels %q) without a live endpoint using it (its endpoints with it: %v)",
					node, h, lk, states[node][lk]))
			}
		}
	}
	slices.Sort(v)
	if len(v) > 6 {
		v = append(v[:6], fmt.Sprintf("etcd identities: and %d more", len(v)-6))
	}
	return v, len(st.ids), nil
}

func readEtcdIdentities(ctx context.Context, cli *clientv3.Client) (etcdIdentities, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	base := simPrefix + "state/identities/v1/"
	resp, err := cli.Get(ctx, base, clientv3.WithPrefix())
	if err != nil {
		return etcdIdentities{}, fmt.Errorf("read identities from etcd: %w", err)
	}
	st := etcdIdentities{ids: map[identity.NumericIdentity]string{}, labels: map[string]string{}, refs: map[string][]string{}}
	for _, kv := range resp.Kvs {
		dir, tail, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), base), "/")
		switch dir {
		case "id":
			n, err := strconv.ParseUint(tail, 10, 16)
			if err != nil {
				return st, fmt.Errorf("etcd: unreadable identity key %s", kv.Key)
			}
			st.ids[identity.NumericIdentity(n)] = string(kv.Value)
		case "labels":
			st.labels[tail] = string(kv.Value)
		case "refs":
			h, node, _ := strings.Cut(tail, "/")
			st.refs[h] = append(st.refs[h], node)
		}
	}
	return st, nil
}

// refHash is pkg/agent/kvstore's name of a label set in refs/: 128 bits
// of the SHA-256 of its labels key, hex.
func refHash(lk string) string {
	sum := sha256.Sum256([]byte(lk))
	return hex.EncodeToString(sum[:16])
}
