//go:build linux

package sse

import "syscall"

// yieldCPU gives the thread's CPU to another runnable thread, of this
// process or another, if one waits (sched_yield(2)); the Go scheduler's
// Gosched would only let this process's goroutines run.
func yieldCPU() { _, _, _ = syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
