package bench

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
)

// TestRoundStats: the rounds recorded between two snapshots, with their
// p50 and p99 as the upper bounds of the quarter-millisecond buckets
// holding them.
func TestRoundStats(t *testing.T) {
	mp, rs := newRoundsProvider()
	defer mp.Shutdown(context.Background())
	h, err := mp.Meter("test").Float64Histogram(roundMetric, metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.001, 1)) // the view's buckets replace these
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h.Record(ctx, 0.5) // before: not counted
	before := rs.snapshot()
	for range 98 {
		h.Record(ctx, 0.0061) // 6.1 ms: the 6.25 ms bucket
	}
	h.Record(ctx, 0.0190) // 19 ms: the 19.0 ms bucket (bounds are inclusive)
	h.Record(ctx, 0.0201) // 20.1 ms: the 20.25 ms bucket
	got := rs.snapshot().since(before)
	want := RoundStats{N: 100, P50: 6250 * time.Microsecond, P99: 19 * time.Millisecond}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if s := rs.snapshot().since(rs.snapshot()); s.N != 0 {
		t.Fatalf("nothing between two snapshots, got %+v", s)
	}
}
