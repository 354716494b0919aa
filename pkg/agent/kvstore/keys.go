package kvstore

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/membrane-cni/membrane/pkg/domain/identity"
)

// Key layout, under Config.Prefix (default "membrane/"):
//
//	state/identities/v1/id/<N>            labels key of identity N (labels.Labels.Key())
//	state/identities/v1/labels/<labels>   N, decimal
//	state/identities/v1/refs/<H>/<node>   N, under <node>'s lease: <node> uses the labels' identity
//	state/identities/v1/gc/<H>            GC mark (value: the labels key): no reference when marked
//	state/identities-gc/v1/collector      the node running the GC passes (its name) under its lease
//	state/nodes/v1/<node>                 the node (JSON nodeRecord) under its lease
//	state/endpoints/v1/<node>/<id>        a local endpoint of <node> (JSON endpointRecord) under its lease
//
// <H> is refHash(labels key): references and marks hang off the label set
// (as Cilium's value/<labels>/<node> keys do) so that a node that lost the
// race to create a label set adds its reference in the same transaction,
// without knowing the number; the hash keeps those keys short and free of
// '/' from label keys. id/<N> and labels/<labels> are created in one
// transaction and deleted in one.
const (
	identitiesDir = "state/identities/v1/"
	idDir         = identitiesDir + "id/"
	labelsDir     = identitiesDir + "labels/"
	refsDir       = identitiesDir + "refs/"
	gcDir         = identitiesDir + "gc/"
	// collectorKey is outside identitiesDir: a pass's read of the
	// identities does not read it.
	collectorKey = "state/identities-gc/v1/collector"
	nodesDir     = "state/nodes/v1/"
	endpointsDir = "state/endpoints/v1/"
)

// keys builds the keys of one prefix.
type keys struct{ prefix string }

func (k keys) id(n identity.NumericIdentity) string { return k.prefix + idDir + itoa(n) }
func (k keys) labels(lk string) string              { return k.prefix + labelsDir + lk }
func (k keys) refs(lk string) string                { return k.prefix + refsDir + refHash(lk) + "/" }
func (k keys) ref(lk string, node string) string    { return k.refs(lk) + node }
func (k keys) gc(lk string) string                  { return k.prefix + gcDir + refHash(lk) }
func (k keys) identities() string                   { return k.prefix + identitiesDir }
func (k keys) collector() string                    { return k.prefix + collectorKey }
func (k keys) ids() string                          { return k.prefix + idDir }
func (k keys) nodes() string                        { return k.prefix + nodesDir }
func (k keys) node(name string) string              { return k.prefix + nodesDir + name }
func (k keys) endpoints() string                    { return k.prefix + endpointsDir }
func (k keys) nodeEndpoints(node string) string     { return k.prefix + endpointsDir + node + "/" }
func (k keys) endpoint(node string, id uint16) string {
	return k.nodeEndpoints(node) + strconv.FormatUint(uint64(id), 10)
}

// refHash names a label set in refs/ and gc/: 128 bits of its SHA-256,
// hex.
func refHash(lk string) string {
	sum := sha256.Sum256([]byte(lk))
	return hex.EncodeToString(sum[:16])
}

func itoa(n identity.NumericIdentity) string { return strconv.FormatUint(uint64(n), 10) }

// parseID parses the <N> of an id/, refs/ or gc/ key's remainder (up to
// the next '/'); ok is false for anything not a valid cluster identity.
func parseID(s string) (identity.NumericIdentity, bool) {
	s, _, _ = strings.Cut(s, "/")
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v < uint64(identity.MinLocalIdentity) || v > uint64(maxID) {
		return 0, false
	}
	return identity.NumericIdentity(v), true
}

// maxID is the largest cluster identity (the datapath's 16-bit range).
const maxID identity.NumericIdentity = 65535
