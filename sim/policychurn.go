package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/membrane-cni/membrane/pkg/clients/client"
)

// Policy churn (--policy-churn P): during the churn phase, for every
// lifecycle, with probability P, one policy change goes through the API:
// a CiliumNetworkPolicy or a Kubernetes NetworkPolicy of a small set of
// names is imported (or replaced, if it exists) with PUT /v1/policy, or
// deleted with DELETE /v1/policy. Each selects the pods of one shard
// (k8s:shard) and allows a peer shard in on a random port; some also
// restrict egress. One change runs at a time, paced by the lifecycles
// completed, so that a slow agent is not buried under policy changes.
// What the agent holds is checked at the end (endchecks.go): every
// endpoint's realised policy equals its computed one, whatever subset of
// changes took effect across crashes and timeouts.

// policyNames is how many distinct policies (per kind) the churn cycles
// through: replacements and deletions need existing names.
const policyNames = 8

// policyChurn is the state of the policy churn goroutine (only it writes
// live); the counters are read by the report.
type policyChurn struct {
	api  *apiDriver
	rng  *rand.Rand
	live map[string]bool // names ("cnp-3") the agent acknowledged and not deleted since
	// unsure are names whose last change failed ambiguously: the agent
	// may or may not hold them.
	unsure map[string]bool

	imports, deletes, failed atomic.Uint64
}

// startPolicyChurn starts the policy churn if the scenario asks for it;
// stop waits for it to end (it ends by itself when the churn phase does).
func (e *engine) startPolicyChurn(ctx context.Context) (stop func()) {
	if e.sc.PolicyChurn <= 0 {
		return func() {}
	}
	pc := &policyChurn{api: &apiDriver{c: e.tgt.Client(), rec: e.rec, gate: &e.gate, epoch: &e.epoch},
		rng: rand.New(rand.NewPCG(e.sc.Seed, 0x9011c7)), live: map[string]bool{}, unsure: map[string]bool{}}
	e.pol.Store(pc)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.runPolicyChurn(cctx, pc)
	}()
	return func() {
		cancel()
		<-done
	}
}

func (e *engine) runPolicyChurn(ctx context.Context, pc *policyChurn) {
	var done uint64
	for ctx.Err() == nil {
		ph := e.phase.Load()
		if ph > phaseChurn {
			return
		}
		want := uint64(e.sc.PolicyChurn * float64(e.churnLifecycles.Load()))
		if ph != phaseChurn || done >= want {
			sleepCtx(ctx, 20*time.Millisecond)
			continue
		}
		e.policyChange(ctx, pc)
		done++
	}
}

// policyChange makes one change: delete an existing policy (30%, when
// there is one), or import one (new or replacing).
func (e *engine) policyChange(ctx context.Context, pc *policyChurn) {
	if len(pc.live) > 0 && pc.rng.Float64() < 0.3 {
		names := slices.Sorted(maps.Keys(pc.live))
		name := names[pc.rng.IntN(len(names))]
		err := pc.api.call(ctx, opPolicyDelete, func(ctx context.Context) error {
			_, err := pc.api.c.PolicyDelete(ctx, simNamespace+"/"+name)
			return err
		})
		switch {
		case err == nil:
			pc.deletes.Add(1)
			delete(pc.live, name)
			delete(pc.unsure, name)
		case client.IsNotFound(err):
			if !pc.unsure[name] {
				e.violate(invPolicyLost, "policy "+name, "", fmt.Sprintf("policy %s/%s was acknowledged and not deleted, "+
					"but DELETE found none", simNamespace, name), nil)
			}
			delete(pc.live, name)
			delete(pc.unsure, name)
		default:
			pc.failed.Add(1)
			if ambiguous(err) {
				pc.unsure[name] = true
			}
		}
		return
	}
	kind := "cnp"
	if pc.rng.IntN(2) == 1 {
		kind = "knp"
	}
	name := kind + "-" + strconv.Itoa(pc.rng.IntN(policyNames))
	doc, err := e.policyDoc(pc.rng, kind, name)
	if err != nil {
		e.note("policy churn: " + err.Error())
		return
	}
	err = pc.api.call(ctx, opPolicyImport, func(ctx context.Context) error {
		_, err := pc.api.c.PolicyImport(ctx, doc, client.ContentTypeJSON)
		return err
	})
	if err != nil {
		pc.failed.Add(1)
		if ambiguous(err) {
			pc.unsure[name] = true
		}
		if isCode(err, "invalid-policy") {
			e.violate(invAgent, "policy "+name, "", fmt.Sprintf("policy churn: the agent refused a valid document: %v", err), nil)
		}
		return
	}
	pc.imports.Add(1)
	pc.live[name] = true
	delete(pc.unsure, name)
}

// invPolicyLost: a policy whose import was acknowledged is gone without
// an acknowledged delete, or one whose delete was acknowledged is back
// (across crashes: policies are persisted before PUT/DELETE answer).
const invPolicyLost = "policy-lost"

// policySetFindings compares the policies the agent holds in the sim's
// namespace with what the churn had acknowledged (nil without churn).
// Only call it once the churn has stopped.
func (e *engine) policySetFindings(ctx context.Context) []finding {
	pc := e.pol.Load()
	if pc == nil {
		return nil
	}
	list, err := e.tgt.Client().PolicyList(ctx)
	if err != nil {
		return []finding{{invPolicyLost, "policies", "", "GET /v1/policy: " + err.Error()}}
	}
	held := map[string]bool{}
	for _, p := range list.Policies {
		if p.Namespace == simNamespace {
			held[p.Name] = true
		}
	}
	var out []finding
	for name := range pc.live {
		if !held[name] && !pc.unsure[name] {
			out = append(out, finding{invPolicyLost, "policy " + name, "", fmt.Sprintf("policy %s/%s was acknowledged and not deleted, "+
				"but the agent does not hold it", simNamespace, name)})
		}
	}
	for name := range held {
		if !pc.live[name] && !pc.unsure[name] {
			out = append(out, finding{invPolicyLost, "policy " + name, "", fmt.Sprintf("the agent holds policy %s/%s, "+
				"whose delete was acknowledged (or that was never imported)", simNamespace, name)})
		}
	}
	return out
}

// policyDoc builds a policy of the given kind ("cnp" or "knp") selecting
// the pods of a random shard and letting another shard in on one port.
func (e *engine) policyDoc(rng *rand.Rand, kind, name string) ([]byte, error) {
	shard, peer := strconv.Itoa(rng.IntN(e.sc.Identities)), strconv.Itoa(rng.IntN(e.sc.Identities))
	port := 1000 + rng.IntN(64)
	proto := []string{"TCP", "UDP"}[rng.IntN(2)]
	meta := map[string]any{"name": name, "namespace": simNamespace, "labels": map[string]string{"sim": "churn"}}
	subject := map[string]any{"matchLabels": map[string]string{"app": "sim", "shard": shard}}
	peerSel := map[string]any{"matchLabels": map[string]string{"shard": peer}}
	var doc map[string]any
	if kind == "cnp" {
		toPort := map[string]any{"ports": []any{map[string]any{"port": strconv.Itoa(port), "protocol": proto}}}
		if e.l7 && proto == "TCP" && rng.IntN(2) == 0 {
			// With the real proxy (linux proxy faults): an L7 rule, so
			// regenerations wait for its acknowledgements.
			toPort["rules"] = map[string]any{"http": []any{map[string]any{"method": "GET", "path": "/sim/" + strconv.Itoa(rng.IntN(8))}}}
		}
		spec := map[string]any{"endpointSelector": subject,
			"ingress": []any{map[string]any{"fromEndpoints": []any{peerSel}, "toPorts": []any{toPort}}}}
		if rng.IntN(3) == 0 {
			spec["egress"] = []any{map[string]any{"toEndpoints": []any{map[string]any{"matchLabels": map[string]string{"app": "sim"}}},
				"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "53", "protocol": "UDP"}}}}}}
		}
		doc = map[string]any{"apiVersion": "cilium.io/v2", "kind": "CiliumNetworkPolicy", "metadata": meta, "spec": spec}
	} else {
		spec := map[string]any{"podSelector": subject,
			"ingress": []any{map[string]any{"from": []any{map[string]any{"podSelector": peerSel}},
				"ports": []any{map[string]any{"port": port, "endPort": port + 1 + rng.IntN(3), "protocol": proto}}}}}
		doc = map[string]any{"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta, "spec": spec}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("policy document %s: %w", name, err)
	}
	return b, nil
}

// policySummary is the report's policy_churn line ("" without churn).
func (e *engine) policySummary() string {
	pc := e.pol.Load()
	if pc == nil {
		return ""
	}
	return fmt.Sprintf("%d imports (new or replacing), %d deletes, %d failed (latency: policy_import, policy_delete)",
		pc.imports.Load(), pc.deletes.Load(), pc.failed.Load())
}
