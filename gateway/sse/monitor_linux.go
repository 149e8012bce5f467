//go:build linux

package sse

import (
	"sync"
	"syscall"
)

// monitor tells the hub when the client of a taken-over connection goes
// away, without a goroutine reading each connection: one epoll instance of
// its own (besides the Go runtime's) watches them all for the peer's close
// (RDHUP, HUP, ERR; never for data, which SSE clients do not send), one
// shot each, and one goroutine waits on it.
type monitor struct {
	epfd int
	wake [2]int // a pipe: writing to it ends run

	mu     sync.Mutex
	next   uint64
	gone   map[uint64]func()
	closed bool
	done   chan struct{}
}

const monitorWakeID = 0 // the pipe's id; connections get 1, 2, …

func newMonitor() (*monitor, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	m := &monitor{epfd: epfd, gone: map[uint64]func(){}, done: make(chan struct{})}
	if err := syscall.Pipe2(m.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(epfd)
		return nil, err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
	setID(&ev, monitorWakeID)
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, m.wake[0], &ev); err != nil {
		m.closeFDs()
		return nil, err
	}
	go m.run()
	return m, nil
}

func setID(ev *syscall.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func eventID(ev *syscall.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// add watches c; gone runs (once, on the monitor's goroutine) when its
// peer closes or resets it.
func (m *monitor) add(c *liveConn, gone func()) error {
	if m == nil || c.raw == nil {
		return nil
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.next++
	id := m.next
	m.gone[id] = gone
	m.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLHUP | syscall.EPOLLERR | syscall.EPOLLONESHOT}
	setID(&ev, id)
	var err error
	cerr := c.raw.Control(func(fd uintptr) { err = syscall.EpollCtl(m.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) })
	if err == nil {
		err = cerr
	}
	if err != nil {
		m.mu.Lock()
		delete(m.gone, id)
		m.mu.Unlock()
		return err
	}
	c.mon = id
	return nil
}

// remove stops watching c; call it before closing c (a closed descriptor's
// number may be reused by the next connection).
func (m *monitor) remove(c *liveConn) {
	if m == nil || c.mon == 0 {
		return
	}
	m.mu.Lock()
	delete(m.gone, c.mon)
	closed := m.closed
	m.mu.Unlock()
	if !closed {
		_ = c.raw.Control(func(fd uintptr) { _ = syscall.EpollCtl(m.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil) })
	}
	c.mon = 0
}

func (m *monitor) run() {
	defer close(m.done)
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(m.epfd, events, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		var calls []func()
		m.mu.Lock()
		for i := range events[:n] {
			id := eventID(&events[i])
			if id == monitorWakeID {
				m.mu.Unlock()
				return
			}
			if f := m.gone[id]; f != nil {
				delete(m.gone, id)
				calls = append(calls, f)
			}
		}
		m.mu.Unlock()
		for _, f := range calls {
			f()
		}
	}
}

// close stops the monitor (connections still watched are not told).
func (m *monitor) close() {
	if m == nil {
		return
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.closed = true
	m.mu.Unlock()
	_, _ = syscall.Write(m.wake[1], []byte{0})
	<-m.done
	m.closeFDs()
}

func (m *monitor) closeFDs() {
	_ = syscall.Close(m.wake[0])
	_ = syscall.Close(m.wake[1])
	_ = syscall.Close(m.epfd)
}
