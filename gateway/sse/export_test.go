package sse

// SetBeforeReplay installs a hook that runs on each stream after its Redis
// subscription is confirmed and before its replay starts, so a test can
// publish events exactly in that window.
func SetBeforeReplay(h *Handler, f func(taskID string)) { h.beforeReplay = f }

// The frame writer and the Last-Event-ID parser, for the fuzz targets.
var (
	AppendFrame      = appendFrame
	ParseLastEventID = parseLastEventID
)
