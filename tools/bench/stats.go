package bench

import (
	"bufio"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of sorted by the
// nearest-rank method, or 0 for an empty slice. sorted must be ascending.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	rank := min(max(int(math.Ceil(p/100*float64(len(sorted)))), 1), len(sorted))
	return sorted[rank-1]
}

// Latencies summarises end-to-end latencies.
type Latencies struct {
	N             int
	P50, P95, P99 time.Duration
	Max           time.Duration
}

// Summarise sorts d in place and returns its percentiles.
func Summarise(d []time.Duration) Latencies {
	slices.Sort(d)
	l := Latencies{N: len(d), P50: Percentile(d, 50), P95: Percentile(d, 95), P99: Percentile(d, 99)}
	if len(d) > 0 {
		l.Max = d[len(d)-1]
	}
	return l
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// resetPeakRSS asks Linux to restart VmHWM from the current RSS, so each
// scenario reports its own peak. It reports whether the kernel allowed it.
func resetPeakRSS() bool {
	return os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
}

// procStatusKB reads one "<field>: N kB" line of /proc/self/status.
func procStatusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		return n
	}
	return 0
}

// serverCPU sums the user+system CPU time of every local process whose
// command is one of names (PostgreSQL backends, redis-server). Processes
// that exit between two readings take their time with them, so this is an
// approximation; it is zero when the servers run on another host.
func serverCPU(names ...string) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		ticks += statTicks(string(b), names)
	}
	const clkTck = 100 // USER_HZ on every Linux architecture Go supports
	return time.Duration(ticks) * time.Second / clkTck
}

// statTicks parses one /proc/<pid>/stat line and returns utime+stime when
// its comm is one of names.
func statTicks(stat string, names []string) int64 {
	open, end := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if open < 0 || end < open {
		return 0
	}
	if !slices.Contains(names, stat[open+1:end]) {
		return 0
	}
	f := strings.Fields(stat[end+1:])
	// After the comm: state(0) ppid(1) … utime(11) stime(12).
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// hostTimes is the first line of /proc/stat: jiffies of every CPU in each
// state, for the host's idle and steal shares over a window.
type hostTimes struct{ total, idle, steal int64 }

func readHostTimes() hostTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return hostTimes{}
	}
	var h hostTimes
	for i, v := range f[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		h.total += n
		switch i {
		case 3, 4: // idle, iowait
			h.idle += n
		case 7:
			h.steal += n
		}
	}
	return h
}

// HostShares is how the host's CPUs spent a window: idle (with iowait) and
// stolen by the hypervisor for other guests, in percent.
type HostShares struct{ Idle, Steal float64 }

func hostShares(a, b hostTimes) HostShares {
	d := b.total - a.total
	if d <= 0 {
		return HostShares{}
	}
	return HostShares{Idle: 100 * float64(b.idle-a.idle) / float64(d), Steal: 100 * float64(b.steal-a.steal) / float64(d)}
}
