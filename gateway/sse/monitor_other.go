//go:build !linux

package sse

// monitor is Linux's epoll close monitor (monitor_linux.go); elsewhere a
// departed client of a taken-over connection is noticed by the next write
// that fails (a heartbeat at the latest).
type monitor struct{}

func newMonitor() (*monitor, error)            { return nil, nil }
func (m *monitor) add(*liveConn, func()) error { return nil }
func (m *monitor) remove(*liveConn)            {}
func (m *monitor) close()                      {}
