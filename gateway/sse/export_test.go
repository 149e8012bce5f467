package sse

import taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"

// SetBeforeReplay installs a hook that runs on each stream after its Redis
// subscription is confirmed and before its replay starts, so a test can
// publish events exactly in that window.
func SetBeforeReplay(h *Handler, f func(taskID string)) { h.beforeReplay = f }

// The frame writer and the Last-Event-ID parser, for the fuzz targets.
var (
	AppendFrame      = appendFrame
	ParseLastEventID = parseLastEventID
)

// PageFrames renders the page of evs as the replay does: frame(i) for
// each event, twice (the second time is what a stream sharing the page
// gets), and encodeFrame of each event on its own, to compare with.
func PageFrames(evs []*taskrunnerv1.Event) (first, again, alone [][]byte, err error) {
	p := &page{ListEventsResponse: &taskrunnerv1.ListEventsResponse{Events: evs}}
	for i, e := range evs {
		a, err := p.frame(i)
		if err != nil {
			return nil, nil, nil, err
		}
		b, _ := p.frame(i)
		c, err := encodeFrame(nil, e)
		if err != nil {
			return nil, nil, nil, err
		}
		first, again, alone = append(first, a), append(again, b), append(alone, c)
	}
	return first, again, alone, nil
}
