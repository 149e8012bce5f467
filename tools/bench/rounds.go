package bench

import (
	"context"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// roundMetric is the SSE writer's round histogram (gateway/sse: a task
// writer's rounds over its parked streams, the fan-out's share of an
// event's delivery latency).
const roundMetric = "taskrunner.sse.round_duration"

// roundBounds are finer than the gateway's own buckets, for percentiles
// within a quarter of a millisecond up to 50 ms.
func roundBounds() []float64 {
	var b []float64
	for us := 250; us <= 50_000; us += 250 {
		b = append(b, float64(us)/1e6)
	}
	return append(b, 0.1, 0.25, 0.5, 1, 2.5, 5)
}

// rounds reads the SSE handler's round histogram (registered on a
// MeterProvider of its own in the bench process).
type rounds struct {
	reader *sdkmetric.ManualReader
}

// newRoundsProvider makes the MeterProvider the handler registers its
// metrics on, with the finer buckets for its rounds.
func newRoundsProvider() (*sdkmetric.MeterProvider, rounds) {
	r := sdkmetric.NewManualReader(sdkmetric.WithTemporalitySelector(func(sdkmetric.InstrumentKind) metricdata.Temporality {
		return metricdata.CumulativeTemporality
	}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r), sdkmetric.WithView(sdkmetric.NewView(
		sdkmetric.Instrument{Name: roundMetric},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: roundBounds()}})))
	return mp, rounds{reader: r}
}

// roundCounts is a snapshot of the histogram: bucket counts (len(bounds)+1).
type roundCounts struct {
	bounds []float64
	counts []uint64
}

// snapshot reads the cumulative histogram now.
func (r rounds) snapshot() roundCounts {
	if r.reader == nil {
		return roundCounts{}
	}
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		return roundCounts{}
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == roundMetric && len(h.DataPoints) > 0 {
				p := h.DataPoints[0]
				return roundCounts{bounds: p.Bounds, counts: append([]uint64(nil), p.BucketCounts...)}
			}
		}
	}
	return roundCounts{}
}

// RoundStats summarises the rounds between two snapshots.
type RoundStats struct {
	N        uint64
	P50, P99 time.Duration // upper bounds of the buckets holding them
}

// since is the rounds recorded after before.
func (c roundCounts) since(before roundCounts) RoundStats {
	d := make([]uint64, len(c.counts))
	var n uint64
	for i, v := range c.counts {
		if i < len(before.counts) {
			v -= before.counts[i]
		}
		d[i], n = v, n+v
	}
	s := RoundStats{N: n}
	if n == 0 {
		return s
	}
	at := func(q float64) time.Duration {
		want := uint64(q*float64(n) + 0.999999)
		var seen uint64
		for i, v := range d {
			seen += v
			if seen >= want {
				if i < len(c.bounds) {
					return time.Duration(c.bounds[i] * float64(time.Second))
				}
				break
			}
		}
		return time.Duration(c.bounds[len(c.bounds)-1] * float64(time.Second)) // beyond the last bound
	}
	s.P50, s.P99 = at(0.50), at(0.99)
	return s
}
