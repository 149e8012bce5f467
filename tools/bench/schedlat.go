package bench

import (
	"math"
	"runtime/metrics"
	"time"
)

const schedMetric = "/sched/latencies:seconds"

// schedSample reads this process's Go scheduler latency histogram: how long
// goroutines stayed runnable before they ran.
func schedSample() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: schedMetric}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// schedLatencies summarises what happened between two samples (bucket upper
// bounds, so an estimate from above).
func schedLatencies(a, b *metrics.Float64Histogram) Latencies {
	if a == nil || b == nil || len(a.Counts) != len(b.Counts) {
		return Latencies{}
	}
	counts := make([]uint64, len(b.Counts))
	var total uint64
	for i := range b.Counts {
		counts[i] = b.Counts[i] - a.Counts[i]
		total += counts[i]
	}
	// upper is bucket i's upper bound (its lower one for the last, open
	// bucket).
	upper := func(i int) time.Duration {
		if math.IsInf(b.Buckets[i+1], 1) {
			return time.Duration(b.Buckets[i] * float64(time.Second))
		}
		return time.Duration(b.Buckets[i+1] * float64(time.Second))
	}
	at := func(p float64) time.Duration {
		want := uint64(float64(total) * p / 100)
		var acc uint64
		for i, c := range counts {
			acc += c
			if acc > want {
				return upper(i)
			}
		}
		return 0
	}
	if total == 0 {
		return Latencies{}
	}
	l := Latencies{N: int(total), P50: at(50), P95: at(95), P99: at(99)}
	for i := len(counts) - 1; i >= 0; i-- {
		if counts[i] > 0 {
			l.Max = upper(i)
			break
		}
	}
	return l
}
