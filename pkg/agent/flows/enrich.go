package flows

import (
	"net/netip"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/clients/models"
	"github.com/membrane-cni/membrane/pkg/domain/endpoint"
	"github.com/membrane-cni/membrane/pkg/domain/identity"
	"github.com/membrane-cni/membrane/pkg/domain/labels"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
	"github.com/membrane-cni/membrane/pkg/domain/service"
)

// Flow types (models.Flow.Type).
const (
	TypeL34 = "l3-l4"
	TypeL7  = "l7"
	TypeDNS = "dns"
)

// Verdicts of drop notifications.
const (
	VerdictDropped = "dropped"
	VerdictAudit   = "audit"
)

// fromFlow enriches a flow report.
func (s *Store) fromFlow(ev datapath.FlowEvent) models.Flow {
	fl := models.Flow{Time: ev.Time, Node: s.cfg.Node, Type: TypeL34, Verdict: ev.Verdict, Direction: ev.Dir.String(),
		Endpoint: uint16(ev.Endpoint), Protocol: protoName(ev.Proto), TCPFlags: tcpFlags(ev.TCPFlags), Bytes: ev.Length}
	if ev.Verdict == datapath.FlowRedirected {
		fl.ProxyPort = ev.ProxyPort
	}
	local, peer := s.sides(&fl, ev.Endpoint, ev.Identity, ev.PeerIdentity, ev.Dir, ev.Src, ev.Dst, ev.SrcPort, ev.DstPort)
	if ev.Frontend.IsValid() {
		fl.Service = ev.Frontend.String()
		if s.cfg.Index != nil {
			if row, ok := s.cfg.Index.Service(service.Frontend{Addr: ev.Frontend.Addr(), Port: ev.Frontend.Port(), Proto: ev.Proto}); ok {
				fl.ServiceName = row.Service.Name
			}
		}
	}
	if ev.Enforced {
		s.explain(&fl, local, peer, ev.DstPort, ev.Proto, ev.Dir, policy.ExplainAllow)
	}
	return fl
}

// fromDrop enriches a drop notification.
func (s *Store) fromDrop(ev datapath.DropEvent) models.Flow {
	fl := models.Flow{Time: ev.Time, Node: s.cfg.Node, Type: TypeL34, Verdict: VerdictDropped, DropReason: ev.Reason,
		Direction: ev.Dir.String(), Endpoint: uint16(ev.Endpoint), Protocol: protoName(ev.Proto), TCPFlags: tcpFlags(ev.TCPFlags),
		Bytes: ev.Length}
	if ev.Reason == datapath.DropPolicyAudit {
		fl.Verdict = VerdictAudit
	}
	var ident identity.NumericIdentity
	if s.cfg.Index != nil && ev.Endpoint != 0 {
		if ep, ok := s.cfg.Index.Endpoint(ev.Endpoint); ok {
			ident = ep.Identity
		}
	}
	local, peer := s.sides(&fl, ev.Endpoint, ident, ev.PeerIdentity, ev.Dir, ev.Src, ev.Dst, ev.SrcPort, ev.DstPort)
	switch ev.Reason {
	case datapath.DropPolicy:
		s.explain(&fl, local, peer, ev.DstPort, ev.Proto, ev.Dir, policy.ExplainDefaultDeny)
	case datapath.DropPolicyDeny:
		s.explain(&fl, local, peer, ev.DstPort, ev.Proto, ev.Dir, policy.ExplainDeny)
	case datapath.DropPolicyAudit:
		if !s.explain(&fl, local, peer, ev.DstPort, ev.Proto, ev.Dir, policy.ExplainDeny) {
			s.explain(&fl, local, peer, ev.DstPort, ev.Proto, ev.Dir, policy.ExplainDefaultDeny)
		}
	}
	return fl
}

// sides fills in the flow's source and destination (the endpoint and its
// peer, by direction) and returns the endpoint's and the peer's labels.
func (s *Store) sides(fl *models.Flow, id endpoint.ID, ident, peerIdent identity.NumericIdentity, dir policy.Direction,
	src, dst netip.Addr, sport, dport uint16) (local, peer labels.Labels) {
	srcP := models.FlowPeer{Port: sport}
	dstP := models.FlowPeer{Port: dport}
	if src.IsValid() {
		srcP.IP, dstP.IP = src.String(), dst.String()
	}
	lp, pp := &srcP, &dstP
	peerAddr := dst
	if dir == policy.Ingress {
		lp, pp, peerAddr = &dstP, &srcP, src
	}
	lp.Identity, pp.Identity = uint32(ident), uint32(peerIdent)
	local = s.describeEndpoint(lp, id)
	peer = s.describePeer(pp, peerAddr)
	fl.Source, fl.Destination = srcP, dstP
	return local, peer
}

// describeEndpoint fills in a local endpoint's pod and labels.
func (s *Store) describeEndpoint(p *models.FlowPeer, id endpoint.ID) labels.Labels {
	ix := s.cfg.Index
	if ix == nil || id == 0 {
		return nil
	}
	ep, ok := ix.Endpoint(id)
	if !ok {
		return nil
	}
	p.Namespace, p.Pod = ep.Namespace, ep.PodName
	if p.Identity == 0 {
		p.Identity = uint32(ep.Identity)
	}
	ls := ep.Labels
	if row, ok := ix.Identity(identity.NumericIdentity(p.Identity)); ok {
		ls = row.Labels
	}
	p.Labels = ls.Strings()
	if p.Namespace == "" {
		p.Namespace, _ = ls.Get(labels.SourceK8s, policy.NamespaceLabel)
	}
	return ls
}

// describePeer fills in the peer's pod (when local) and its identity's
// labels and namespace.
func (s *Store) describePeer(p *models.FlowPeer, addr netip.Addr) labels.Labels {
	ix := s.cfg.Index
	if ix == nil {
		return nil
	}
	if addr.IsValid() {
		if ep, ok := ix.EndpointByIP(addr); ok {
			p.Namespace, p.Pod = ep.Namespace, ep.PodName
			if p.Identity == 0 {
				p.Identity = uint32(ep.Identity)
			}
		}
	}
	if p.Identity == 0 {
		return nil
	}
	row, ok := ix.Identity(identity.NumericIdentity(p.Identity))
	if !ok {
		return nil
	}
	p.Labels = row.Labels.Strings()
	if p.Namespace == "" {
		p.Namespace, _ = row.Labels.Get(labels.SourceK8s, policy.NamespaceLabel)
	}
	return row.Labels
}

// explain names the policies behind the verdict (policy.Explain) and
// reports whether it found any. Answers are cached per policy revision
// and (identities, port, protocol, direction, kind): re-evaluating every
// policy costs tens of microseconds per flow with a hundred of them.
func (s *Store) explain(fl *models.Flow, local, peer labels.Labels, port uint16, proto uint8, dir policy.Direction, want int) bool {
	ix := s.cfg.Index
	if ix == nil || local == nil {
		return false
	}
	src, dst := fl.Source.Identity, fl.Destination.Identity
	peerIP := fl.Destination.IP
	if dir == policy.Ingress {
		src, dst, peerIP = dst, src, fl.Source.IP
	}
	var peerNames []string
	if ip, err := netip.ParseAddr(peerIP); err == nil && dir == policy.Egress {
		peerNames = s.names.namesOf(ip, s.cfg.Now())
	}
	localIP := fl.Source.IP
	k := explainKey{local: src, peer: dst, names: joinNames(peerNames), port: port, proto: proto, dir: dir, want: want}
	if dir == policy.Ingress {
		localIP = fl.Destination.IP
		k.endpoint = localIP
	}
	rev := ix.PolicyRevisionNow()
	s.explainMu.Lock()
	if s.explained == nil || s.explainRev != rev || len(s.explained) >= maxExplained {
		s.explained, s.explainRev = map[explainKey][]string{}, rev
	}
	names, ok := s.explained[k]
	s.explainMu.Unlock()
	if !ok {
		rows := ix.Policies()
		pols := make([]*policy.Policy, 0, len(rows))
		for _, r := range rows {
			pols = append(pols, r.Policy)
		}
		named := s.portResolver(localIP, peerIP, dst, dir)
		names = policy.Explain(pols, local, peer, peerNames, named, port, proto, dir, want)
		s.explainMu.Lock()
		if s.explainRev == rev {
			s.explained[k] = names
		}
		s.explainMu.Unlock()
	}
	if len(names) == 0 {
		return false
	}
	fl.Policies = names
	fl.PolicyMatch = [...]string{"allow", "deny", "default-deny"}[want]
	return true
}

// maxExplained bounds the explain cache; a full cache starts over.
const maxExplained = 4096

// explainKey is what an explanation depends on besides the policies:
// the endpoint's identity (subject) and the peer's, by identity number
// (an identity's labels never change), and the names the peer's address
// was learned for (joinNames).
type explainKey struct {
	local, peer uint32
	// endpoint is the local endpoint's address on ingress, whose own
	// named ports resolve the rules' port names (endpoints of one
	// identity may number a name differently); "" on egress.
	endpoint string
	names    string
	port     uint16
	proto    uint8
	dir      policy.Direction
	want     int
}

// protoName names an IP protocol ("" when none is known).
func protoName(p uint8) string {
	if p == 0 {
		return ""
	}
	return policy.ProtoName(p)
}

// tcpFlags names the bits of a TCP flags byte.
func tcpFlags(b uint8) []string {
	var out []string
	for i, name := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"} {
		if b&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return out
}
