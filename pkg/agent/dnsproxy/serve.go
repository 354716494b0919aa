package dnsproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/membrane-cni/membrane/datapath"
	"github.com/membrane-cni/membrane/pkg/domain/policy"
)

// maxReplySockets bounds the reply sockets kept (one per server address
// answered from); beyond it they are all closed and opened anew.
const maxReplySockets = 64

// tcpIdle bounds a TCP connection's wait for its next query.
const tcpIdle = 10 * time.Second

// maxQuerySize is the largest UDP query read (a query is one question;
// a longer datagram is cut and fails to unpack).
const maxQuerySize = 4096

// replySocket is a UDP socket bound to a server's address, to answer
// pods from it.
type replySocket struct{ conn *net.UDPConn }

// Listen opens the transparent sockets (IPv4, and IPv6 where the node's
// loopback has it).
func (p *Proxy) Listen() error {
	socks, err := p.sockets.ListenTransparent(p.cfg.Port)
	if err != nil {
		return err
	}
	p.socks = socks
	return nil
}

// Serve serves on the sockets Listen opened until ctx ends; it returns
// once every handler finished.
func (p *Proxy) Serve(ctx context.Context) error {
	socks := p.socks
	if socks == nil {
		return errors.New("dns proxy: serve before listen")
	}
	var wg sync.WaitGroup
	go func() {
		<-ctx.Done()
		socks.Close()
	}()
	wg.Add(1)
	go func() { defer wg.Done(); p.upstream.run(ctx) }()
	for _, udp := range socks.UDP {
		wg.Add(1)
		go func() { defer wg.Done(); p.serveUDP(ctx, udp, &wg) }()
	}
	for _, tcp := range socks.TCP {
		wg.Add(1)
		go func() { defer wg.Done(); p.serveTCP(ctx, tcp, &wg) }()
	}
	p.log.Info("dns proxy listening", "port", p.cfg.Port, "families", len(socks.UDP))
	wg.Wait()
	p.closeReplies()
	return nil
}

func (p *Proxy) acquire() bool {
	select {
	case p.sem <- struct{}{}:
		return true
	default:
		p.count(&p.dropped, "dropped")
		return false
	}
}

func (p *Proxy) release() { <-p.sem }

func (p *Proxy) serveUDP(ctx context.Context, conn *net.UDPConn, wg *sync.WaitGroup) {
	oob := make([]byte, datapath.OrigDstOOBSize)
	buf := make([]byte, maxQuerySize)
	for {
		n, oobn, _, src, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("dns proxy: udp read", "err", err)
			continue
		}
		dst, err := datapath.OrigDst(oob[:oobn])
		if err != nil {
			p.log.Warn("dns proxy: udp datagram without its destination", "src", src, "err", err)
			continue
		}
		req := new(dns.Msg)
		// A copy: the handler outlives this read, buf does not.
		if err := req.Unpack(append([]byte(nil), buf[:n]...)); err != nil {
			p.count(&p.errs, VerdictError)
			continue // not DNS: nothing to answer
		}
		if !p.acquire() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.release()
			resp, raw := p.resolve(ctx, req, src, dst, policy.ProtoUDP)
			if err := p.replyUDP(dst, src, req, resp, raw); err != nil {
				p.log.Warn("dns proxy: udp reply", "to", src, "from", dst, "err", err)
			}
			p.upstream.refill(dst)
		}()
	}
}

// replyUDP sends resp from the server's address (from) to the pod, cut
// to the size the query allows (512 bytes, or its EDNS0 buffer size):
// the TC bit makes the client retry over TCP. raw, when not nil, is
// resp as the server sent it: sent as it is when it fits.
func (p *Proxy) replyUDP(from, to netip.AddrPort, req, resp *dns.Msg, raw []byte) error {
	size := dns.MinMsgSize
	if opt := req.IsEdns0(); opt != nil {
		size = max(size, int(opt.UDPSize()))
	}
	b := raw
	if b == nil || len(b) > size {
		resp.Truncate(size)
		var err error
		if b, err = resp.Pack(); err != nil {
			return fmt.Errorf("pack: %w", err)
		}
	}
	s, err := p.replySocket(from)
	if err != nil {
		return err
	}
	_, err = s.conn.WriteToUDPAddrPort(b, to)
	return err
}

func (p *Proxy) replySocket(from netip.AddrPort) (*replySocket, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.replies[from]; ok {
		return s, nil
	}
	if len(p.replies) >= maxReplySockets {
		p.closeRepliesLocked()
	}
	conn, err := p.sockets.BindTransparentUDP(from)
	if err != nil {
		return nil, err
	}
	s := &replySocket{conn: conn}
	p.replies[from] = s
	return s, nil
}

func (p *Proxy) closeReplies() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeRepliesLocked()
}

func (p *Proxy) closeRepliesLocked() {
	for k, s := range p.replies {
		s.conn.Close()
		delete(p.replies, k)
	}
}

func (p *Proxy) serveTCP(ctx context.Context, ln *net.TCPListener, wg *sync.WaitGroup) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			p.log.Warn("dns proxy: tcp accept", "err", err)
			continue
		}
		if !p.acquire() {
			c.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.release()
			defer c.Close()
			p.serveConn(ctx, c)
		}()
	}
}

// serveConn answers the queries of one TCP connection in turn; its local
// address is the server the pod connected to.
func (p *Proxy) serveConn(ctx context.Context, c net.Conn) {
	src, err1 := netip.ParseAddrPort(c.RemoteAddr().String())
	dst, err2 := netip.ParseAddrPort(c.LocalAddr().String())
	if err := errors.Join(err1, err2); err != nil {
		return
	}
	src, dst = netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	dc := &dns.Conn{Conn: c}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	for {
		_ = c.SetReadDeadline(time.Now().Add(tcpIdle))
		req, err := dc.ReadMsg()
		if err != nil {
			return
		}
		resp := p.Resolve(ctx, req, src, dst, policy.ProtoTCP)
		_ = c.SetWriteDeadline(time.Now().Add(tcpIdle))
		if err := dc.WriteMsg(resp); err != nil {
			return
		}
	}
}
