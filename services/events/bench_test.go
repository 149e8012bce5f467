package events_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// BenchmarkConnectThroughput streams from 20 runners at once through real
// mTLS, group commit and Redis; it reports acknowledged events per second.
// Run: go test -run '^$' -bench Connect -benchtime 5x ./events/
func BenchmarkConnectThroughput(b *testing.B) {
	const runners, perRunner = 20, 1000
	for b.Loop() {
		b.StopTimer()
		e := newEnv(b)
		in := e.start(b, "127.0.0.1:0")
		ids := make([]string, runners)
		for i := range ids {
			ids[i] = e.runningTask(b, "bench")
		}
		b.StartTimer()
		start := time.Now()
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Go(func() {
				c := e.runner(b, in.addr, id)
				for range perRunner {
					_, err := c.Send(&taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{"log tail of about two hundred bytes ........................................................................................................................................................."}}}})
					require.NoError(b, err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				require.NoError(b, c.Close(ctx))
			})
		}
		wg.Wait()
		b.ReportMetric(float64(runners*perRunner)/time.Since(start).Seconds(), "events/s")
	}
}
