package actors

import (
	"errors"
	"net/netip"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/messages"
	"github.com/membrane-cni/membrane/pkg/domain/index"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// errReplaceInterrupted answers the last message of a replacement run
// whose beginning the ipcache actor no longer holds.
var errReplaceInterrupted = errors.New("remote endpoint replacement interrupted (a newer one began or the ipcache restarted); repeat it")

// remoteReplace is a replacement run in progress for one origin: the
// addresses it (or an upsert of the origin meanwhile) set.
type remoteReplace struct {
	token uint64
	seen  map[netip.Addr]struct{}
}

// remote applies one IPCacheRemote: remote endpoints are another claim
// source (index.SourceRemote), one claim per origin and address, ranked
// below this node's endpoints and reserved addresses (sourceRank). A
// remote endpoint with a reserved identity is ignored.
func (a *ipcacheActor) remote(ctx actor.Context, msg *messages.IPCacheRemote) {
	run := a.replacing[msg.Origin]
	if msg.Replace != 0 && msg.First {
		run = &remoteReplace{token: msg.Replace, seen: map[netip.Addr]struct{}{}}
		a.replacing[msg.Origin] = run
	}
	var ports []policy.EndpointPortsChange
	for _, ip := range msg.Deletes {
		ip = ip.Unmap()
		if run != nil {
			delete(run.seen, ip)
		}
		p := netip.PrefixFrom(ip, ip.BitLen())
		if len(a.remotePorts(p, msg.Origin)) > 0 {
			ports = append(ports, policy.EndpointPortsChange{Owner: remotePortOwner(msg.Origin, ip)})
		}
		a.drop(ctx, p, a.remoteClaimOf(msg.Origin))
	}
	for i := range msg.Upserts {
		r := &msg.Upserts[i]
		if r.Identity.IsReserved() {
			// Only this node assigns reserved identities (the sources
			// refuse them already, endpoint.Remote.CheckOwner).
			a.log.Warn("remote endpoint with a reserved identity ignored", "origin", msg.Origin, "node", r.Node, "ips", r.IPs, "identity", r.Identity)
			continue
		}
		c := index.IPCacheClaim{Source: index.SourceRemote, Identity: r.Identity, Origin: msg.Origin, NodeIP: r.NodeIP.Unmap(),
			NamedPorts: r.NamedPorts}
		for _, ip := range r.IPs {
			ip = ip.Unmap()
			if run != nil {
				run.seen[ip] = struct{}{}
			}
			p := netip.PrefixFrom(ip, ip.BitLen())
			if old := a.remoteClaim(p, msg.Origin); (old != nil && len(old.NamedPorts) > 0) || len(r.NamedPorts) > 0 {
				if old == nil || old.Identity != r.Identity || !old.NamedPorts.Equal(r.NamedPorts) {
					ports = append(ports, policy.EndpointPortsChange{Owner: remotePortOwner(msg.Origin, ip), Identity: r.Identity, Ports: r.NamedPorts})
				}
			}
			a.claim(ctx, p, c)
		}
	}
	var err error
	if msg.Replace != 0 && msg.Last {
		if run == nil || run.token != msg.Replace {
			err = errReplaceInterrupted
		} else {
			ports = a.sweepRemote(ctx, msg.Origin, run.seen, ports)
			delete(a.replacing, msg.Origin)
		}
	}
	if len(ports) > 0 {
		ctx.Send(a.deps.policy, &messages.PolicyRemotePorts{Set: ports})
	}
	a.rec.sync(ctx)
	if ctx.Sender() != nil {
		a.batch.reply(ctx, ctx.Sender(), &messages.IPCacheRemoteResult{Err: err})
	}
}

// sweepRemote drops origin's claims on every address not in keep and
// appends to ports the named ports that go with them.
func (a *ipcacheActor) sweepRemote(ctx actor.Context, origin string, keep map[netip.Addr]struct{}, ports []policy.EndpointPortsChange) []policy.EndpointPortsChange {
	match := a.remoteClaimOf(origin)
	var stale []netip.Prefix
	for p, e := range a.entries {
		if _, ok := keep[p.Addr()]; ok {
			continue
		}
		for _, c := range e.Claims {
			if match(c) {
				stale = append(stale, p)
				break
			}
		}
	}
	for _, p := range stale {
		if len(a.remotePorts(p, origin)) > 0 {
			ports = append(ports, policy.EndpointPortsChange{Owner: remotePortOwner(origin, p.Addr())})
		}
		a.drop(ctx, p, match)
	}
	if len(stale) > 0 {
		a.log.Info("remote endpoints swept", "origin", origin, "deleted", len(stale), "kept", len(keep))
	}
	return ports
}

// remoteClaim returns origin's claim on p (nil: none).
func (a *ipcacheActor) remoteClaim(p netip.Prefix, origin string) *index.IPCacheClaim {
	e := a.entries[p]
	if e == nil {
		return nil
	}
	for i := range e.Claims {
		if c := &e.Claims[i]; c.Source == index.SourceRemote && c.Origin == origin {
			return c
		}
	}
	return nil
}

func (a *ipcacheActor) remotePorts(p netip.Prefix, origin string) policy.NamedPorts {
	if c := a.remoteClaim(p, origin); c != nil {
		return c.NamedPorts
	}
	return nil
}

// remotePortOwner is the policy repository's key for the named ports of
// origin's remote endpoint at ip (one per address: an endpoint with two
// counts twice, which the union per identity does not mind).
func remotePortOwner(origin string, ip netip.Addr) string {
	return "remote:" + origin + "|" + ip.String()
}

func (a *ipcacheActor) remoteClaimOf(origin string) func(index.IPCacheClaim) bool {
	return func(c index.IPCacheClaim) bool { return c.Source == index.SourceRemote && c.Origin == origin }
}
