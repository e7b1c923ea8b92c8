package redistest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Proxy is a TCP proxy to a Redis server whose connections can be
// blackholed, as a NAT or load balancer does when it drops a connection
// without telling either end: what is sent is read and thrown away, in
// both directions, and nothing is closed.
type Proxy struct {
	ln     net.Listener
	target string
	// holeAll blackholes connections accepted from now on too.
	holeAll atomic.Bool

	mu    sync.Mutex
	pairs []*proxied
}

// proxied is one connection through the proxy and its own to the server.
type proxied struct {
	client, server net.Conn
	hole           atomic.Bool
}

// StartProxy starts a proxy to target (host:port); the test's cleanup
// stops it and closes its connections.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target}
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// Addr returns the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Blackhole blackholes every connection open now, and returns how many.
func (p *Proxy) Blackhole() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.pairs {
		c.hole.Store(true)
	}
	return len(p.pairs)
}

// BlackholeAll blackholes every connection, open now or accepted later
// (which then reach the server, but carry nothing).
func (p *Proxy) BlackholeAll() {
	p.holeAll.Store(true)
	p.Blackhole()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxied{client: c, server: s}
		pc.hole.Store(p.holeAll.Load())
		p.mu.Lock()
		p.pairs = append(p.pairs, pc)
		p.mu.Unlock()
		go pc.pipe(s, c)
		go pc.pipe(c, s)
	}
}

// pipe copies src to dst until either fails, or throws it away once the
// pair is blackholed.
func (pc *proxied) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !pc.hole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			if pc.hole.Load() {
				return // a blackholed pair closes nothing
			}
			pc.client.Close()
			pc.server.Close()
			return
		}
	}
}

func (p *Proxy) close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.pairs {
		c.client.Close()
		c.server.Close()
	}
}
