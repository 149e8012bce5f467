package bench

import (
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
	at := func(p float64) time.Duration {
		want := uint64(float64(total) * p / 100)
		var acc uint64
		for i, c := range counts {
			acc += c
			if acc > want {
				return time.Duration(b.Buckets[i+1] * float64(time.Second))
			}
		}
		return 0
	}
	if total == 0 {
		return Latencies{}
	}
	return Latencies{N: int(total), P50: at(50), P95: at(95), P99: at(99), Max: at(99.99)}
}
