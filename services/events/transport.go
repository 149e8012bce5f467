package events

import "google.golang.org/grpc"

// StreamWindow is the fixed HTTP/2 flow-control window, per stream and per
// connection, of the runner protocol on both ends (the runner's client in
// runner/eventsclient uses the same value).
//
// Fixing the window turns off grpc-go's dynamic window, whose bandwidth
// estimator answers a data frame that arrives while no estimate is in
// flight with a PING (and the peer with a PING ack). A runner's stream is
// sparse, small messages with gaps between them, so nearly every event and
// every Ack would cost two extra frames, writes and wake-ups on each side.
// 1 MiB keeps a stream at about 4 MB/s (some 13,000 log events/s) even at a
// 250 ms round trip, far above what one agent produces, and bounds what a
// server buffers per stream.
const StreamWindow = 1 << 20

// ServerOptions are the gRPC server options for a listener that serves
// Connect: the fixed flow-control window above. Append them to the mTLS
// server's options.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.InitialWindowSize(StreamWindow), grpc.InitialConnWindowSize(StreamWindow)}
}
