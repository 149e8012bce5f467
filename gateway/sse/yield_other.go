//go:build !linux

package sse

import "runtime"

// yieldCPU lets other goroutines run (sched_yield on Linux: yield_linux.go).
func yieldCPU() { runtime.Gosched() }
