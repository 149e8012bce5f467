package sse

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// CutOff is the number of clients cut off for being too slow since start.
func (h *Handler) CutOff() int64 { return h.hub.cutSlow.Load() }

// QueuedBytes is the bytes of live frames waiting for their clients, over
// every open stream (each stream counts what it has not read of its task's
// ring; the frames themselves are held once per task).
func (h *Handler) QueuedBytes() int64 { return h.hub.queued() }

// RegisterMetrics reports the handler's gauges on meter, for the gateway's
// /metrics: taskrunner.sse.subscribers (open streams),
// taskrunner.sse.channels (task channels subscribed in Redis),
// taskrunner.sse.queued_bytes (see QueuedBytes) and the counter
// taskrunner.sse.cut_off (clients cut off for being too slow).
func (h *Handler) RegisterMetrics(meter metric.Meter) error {
	subs, err := meter.Int64ObservableGauge("taskrunner.sse.subscribers", metric.WithDescription("Open SSE streams"))
	if err != nil {
		return err
	}
	chans, err := meter.Int64ObservableGauge("taskrunner.sse.channels", metric.WithDescription("Task channels the SSE hub has subscribed in Redis"))
	if err != nil {
		return err
	}
	queued, err := meter.Int64ObservableGauge("taskrunner.sse.queued_bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes of live SSE frames not yet written to their clients, summed over open streams"))
	if err != nil {
		return err
	}
	cut, err := meter.Int64ObservableCounter("taskrunner.sse.cut_off", metric.WithDescription("SSE clients cut off for falling a whole ring behind"))
	if err != nil {
		return err
	}
	_, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(subs, h.Subscribers())
		o.ObserveInt64(chans, int64(h.Channels()))
		o.ObserveInt64(queued, h.QueuedBytes())
		o.ObserveInt64(cut, h.CutOff())
		return nil
	}, subs, chans, queued, cut)
	return err
}
