package sse

import (
	"errors"
	"net"
	"net/http"
	"syscall"
	"time"
)

// A live stream's HTTP/1.1 connection is taken over from net/http once the
// stream has caught up (see stream.park): the response was started with
// "Transfer-Encoding: identity", which makes net/http send no chunking and
// a "Connection: close" (the setup the SSE specification recommends), so
// from then on the connection carries the event stream's bytes as they
// are, and the stream ends by closing it. Taking it over lets the
// connection's net/http goroutine and buffers go, and lets the topic's
// writer write to it without a goroutine of its own (hub.write).

// liveConn is a taken-over connection.
type liveConn struct {
	nc  net.Conn
	raw syscall.RawConn // nil: not a socket, no non-blocking writes (never parked)
	mon uint64          // its id in the hub's close monitor (0: not watched)

	// tryWrite's call to raw.Write, made once (a closure per call would
	// put it and its results on the heap: three allocations per
	// delivery), and what it writes and returns. Only the topic's writer
	// calls tryWrite, one call at a time.
	writeFn func(fd uintptr) bool
	buf     []byte
	n       int
	err     error
}

// errWouldBlock: the socket's send buffer is full.
var errWouldBlock = errors.New("sse: the connection's send buffer is full")

// canTakeOver reports whether the connection under w can be taken over:
// HTTP/1.x, and a writer (through any wrappers with Unwrap, as
// http.ResponseController walks them) that can hijack.
func canTakeOver(w http.ResponseWriter, r *http.Request) bool {
	if r.ProtoMajor != 1 {
		return false
	}
	for {
		if _, ok := w.(http.Hijacker); ok {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
}

// takeOver hijacks the connection of a response whose head and body so far
// were flushed.
func takeOver(rc *http.ResponseController) (*liveConn, error) {
	nc, _, err := rc.Hijack()
	if err != nil {
		return nil, err
	}
	// Whatever the client sent after its request (it should send nothing)
	// is left unread with net/http's buffers.
	lc := &liveConn{nc: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			lc.raw = raw
			lc.writeFn = lc.write
		}
	}
	return lc, nil
}

// tryWrite writes as much of b as the socket takes now, without waiting:
// n < len(b) with a nil error means the send buffer is full. One write(2),
// no goroutine parked, no deadline touched, nothing allocated.
func (c *liveConn) tryWrite(b []byte) (n int, err error) {
	c.buf = b
	cerr := c.raw.Write(c.writeFn)
	n, err = c.n, c.err
	c.buf, c.n, c.err = nil, 0, nil
	if err == syscall.EAGAIN {
		return 0, nil
	}
	if n < 0 {
		n = 0
	}
	if err == nil {
		err = cerr
	}
	return n, err
}

// write is writeFn: one write(2) of buf, retried on EINTR.
func (c *liveConn) write(fd uintptr) bool {
	for {
		c.n, c.err = syscall.Write(int(fd), c.buf)
		if c.err != syscall.EINTR {
			return true
		}
	}
}

// setDeadline sets the write deadline.
func (c *liveConn) setDeadline(t time.Time) error { return c.nc.SetWriteDeadline(t) }
