package sse

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"go.opentelemetry.io/otel/metric"
)

// CutOff is the number of clients cut off for being too slow since start.
func (h *Handler) CutOff() int64 { return h.hub.cutSlow.Load() }

// QueuedBytes is the bytes of live frames waiting for their clients, over
// every open stream (each stream counts what it has not read of its task's
// ring; the frames themselves are held once per task).
func (h *Handler) QueuedBytes() int64 { return h.hub.queued() }

// Parked is the number of open streams that have caught up and have no
// goroutine of their own: their topic's writer writes to them.
func (h *Handler) Parked() int64 { return h.hub.parkedCount() }

// RegisterMetrics reports the handler's gauges on meter, for the gateway's
// /metrics: taskrunner.sse.subscribers (open streams),
// taskrunner.sse.parked (of them, those without a goroutine),
// taskrunner.sse.channels (task channels subscribed in Redis),
// taskrunner.sse.queued_bytes (see QueuedBytes), the counter
// taskrunner.sse.cut_off (clients cut off for being too slow), the
// histogram taskrunner.sse.round_duration (a task writer's rounds over its
// parked streams: the fan-out's share of the delivery latency), and the
// process's own cost, to divide by the open streams: its resident memory
// (taskrunner.process.resident_memory, Linux), CPU time
// (taskrunner.process.cpu_time, user+system) and goroutines
// (taskrunner.process.goroutines).
func (h *Handler) RegisterMetrics(meter metric.Meter) error {
	var err error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		if err != nil {
			return nil
		}
		var g metric.Int64ObservableGauge
		g, err = meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		return g
	}
	subs := gauge("taskrunner.sse.subscribers", "{stream}", "Open SSE streams")
	parked := gauge("taskrunner.sse.parked", "{stream}", "Open SSE streams without a goroutine of their own (caught up; written by their task's writer)")
	chans := gauge("taskrunner.sse.channels", "{channel}", "Task channels the SSE hub has subscribed in Redis")
	queued := gauge("taskrunner.sse.queued_bytes", "By", "Bytes of live SSE frames not yet written to their clients, summed over open streams")
	rss := gauge("taskrunner.process.resident_memory", "By", "Resident memory of the gateway process (divide by taskrunner.sse.subscribers for the cost of a stream)")
	gor := gauge("taskrunner.process.goroutines", "{goroutine}", "Goroutines of the gateway process")
	if err != nil {
		return err
	}
	cut, err := meter.Int64ObservableCounter("taskrunner.sse.cut_off", metric.WithDescription("SSE clients cut off for falling a whole ring behind"))
	if err != nil {
		return err
	}
	rounds, err := meter.Float64Histogram("taskrunner.sse.round_duration", metric.WithUnit("s"),
		metric.WithDescription("How long a task's writer took to go once round its parked streams, for rounds that wrote (the longest wait a task's subscribers add to an event's delivery)"),
		metric.WithExplicitBucketBoundaries(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1))
	if err != nil {
		return err
	}
	h.hub.rounds.Store(&rounds)
	cpu, err := meter.Float64ObservableCounter("taskrunner.process.cpu_time", metric.WithUnit("s"),
		metric.WithDescription("CPU time (user+system) of the gateway process"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(subs, h.Subscribers())
		o.ObserveInt64(parked, h.Parked())
		o.ObserveInt64(chans, int64(h.Channels()))
		o.ObserveInt64(queued, h.QueuedBytes())
		o.ObserveInt64(cut, h.CutOff())
		if b, ok := residentBytes(); ok {
			o.ObserveInt64(rss, b)
		}
		o.ObserveInt64(gor, int64(runtime.NumGoroutine()))
		var ru syscall.Rusage
		if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
			o.ObserveFloat64(cpu, float64(ru.Utime.Nano()+ru.Stime.Nano())/1e9)
		}
		return nil
	}, subs, parked, chans, queued, cut, rss, gor, cpu)
	return err
}

// residentBytes reads the process's resident set size (Linux: /proc).
func residentBytes() (int64, bool) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * int64(os.Getpagesize()), true
}
