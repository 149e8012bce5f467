package bench

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// DelayProxy is a TCP relay that delays every byte by half the round trip
// in each direction, so a request and its answer see RTT more than on a
// direct loopback connection. It models latency only: bandwidth is not
// limited and chunks keep their order.
type DelayProxy struct {
	ln     net.Listener
	target string
	oneWay time.Duration

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewDelayProxy listens on a loopback port and relays to target with rtt
// added to every round trip.
func NewDelayProxy(target string, rtt time.Duration) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &DelayProxy{ln: ln, target: target, oneWay: rtt / 2, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address runners dial instead of target.
func (p *DelayProxy) Addr() string { return p.ln.Addr().String() }

// Close stops accepting, cuts every relayed connection and waits for the
// relay goroutines.
func (p *DelayProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *DelayProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *DelayProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		for _, x := range []net.Conn{c, u} {
			if tc, ok := x.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
		}
		if !p.track(c, u) {
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			var both sync.WaitGroup
			both.Go(func() { p.relay(u, c) })
			both.Go(func() { p.relay(c, u) })
			both.Wait()
			_ = c.Close()
			_ = u.Close()
			p.mu.Lock()
			delete(p.conns, c)
			delete(p.conns, u)
			p.mu.Unlock()
		}()
	}
}

// chunk is bytes read at some moment, to be written oneWay later.
type chunk struct {
	due  time.Time
	data []byte
}

// relay copies src to dst, each chunk released oneWay after it was read.
// The queue between reader and writer is large enough that the delay, not
// TCP flow control, bounds a fast sender (about 64 MiB in flight at most).
func (p *DelayProxy) relay(dst, src net.Conn) {
	q := make(chan chunk, 2048)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.data); err != nil {
				// Unblock the reader, and keep draining so it never blocks
				// on a full queue.
				_ = src.Close()
				for range q {
				}
				return
			}
		}
	}()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{due: time.Now().Add(p.oneWay), data: buf[:n]}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = src.Close()
			}
			break
		}
	}
	close(q)
	<-done
	// Half-close so the peer sees EOF after the delayed bytes, as TCP would.
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		_ = dst.Close()
	}
}
