package bench

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSSEScenariosEndToEnd runs a tiny version of every bench-sse scenario
// on both hubs through the real parent/child protocol, against the real
// PostgreSQL and Redis: every subscriber gets every event of its task
// exactly once, idle connections are all open when the server's memory is
// read, and the figures the tables and goals use are filled in.
func TestSSEScenariosEndToEnd(t *testing.T) {
	ctx := context.Background()
	env, err := NewSSEEnv(ctx, slog.New(slog.DiscardHandler), []string{os.Args[0], "-test.run=^$"})
	if err != nil {
		if os.Getenv("TASKRUNNER_REQUIRE_SERVICES") != "" {
			t.Fatalf("PostgreSQL and Redis are required: %v", err)
		}
		t.Skipf("PostgreSQL or Redis unavailable: %v", err)
	}
	defer env.Close()
	t.Setenv(clientEnv, "sse") // inherited by the client processes
	common := SSEScenario{Drain: 20 * time.Second, Concurrency: 8, Settle: 10 * time.Millisecond}
	var results []SSEResult
	for _, sc := range []SSEScenario{
		{Name: "1×5 seq", Kind: KindFanout, Tasks: 1, Subs: 5, Events: 30},
		{Name: "1×5 paced", Kind: KindFanout, Tasks: 1, Subs: 5, Events: 20, Rate: 200},
		{Name: "3×2 seq", Kind: KindFanout, Tasks: 3, Subs: 2, Events: 10},
		{Name: "idle 12", Kind: KindIdle, Tasks: 4, Subs: 3},
	} {
		for _, hub := range []string{HubTaskrunner, HubMercure} {
			sc.Hub, sc.Drain, sc.Concurrency, sc.Settle = hub, common.Drain, common.Concurrency, common.Settle
			t.Run(sc.Name+" "+hub, func(t *testing.T) {
				r, err := env.RunSSE(ctx, sc)
				require.NoError(t, err)
				require.True(t, r.Complete(), "lost %d, dup %d, failed %d, first error %q", r.Lost, r.Duplicates, r.ConnectFailed, r.FirstErr)
				require.Zero(t, r.ConnectFailed)
				require.Positive(t, r.ServerCPU)
				require.Positive(t, r.CPU)
				require.Positive(t, r.Window)
				n := int64(sc.Connections())
				require.Equal(t, n, int64(r.Connect.N), "every subscriber connected once")
				if sc.Kind == KindFanout {
					want := int64(sc.Tasks) * int64(sc.Events)
					require.Equal(t, want, r.Published)
					require.Equal(t, n*int64(sc.Events), r.Expected)
					require.Equal(t, r.Expected, r.Delivered)
					require.Equal(t, int(r.Delivered), r.Latency.N, "one latency per copy")
					require.Positive(t, r.Latency.P50)
					require.Positive(t, r.DeliveriesPerSec())
					require.Equal(t, int(want), r.FirstCopy.N, "a first and a last copy per event")
					require.Equal(t, int(want), r.LastCopy.N)
					require.LessOrEqual(t, r.FirstCopy.P50, r.LastCopy.P50)
					require.Equal(t, r.Latency.Max, r.LastCopy.Max, "the slowest copy is some event's last")
					if sc.Rate == 0 {
						require.Equal(t, int(want), r.Ack.N, "a sequential publisher times every acknowledgement")
					} else {
						// 20 events at 200/s take at least 95 ms.
						require.GreaterOrEqual(t, r.PublishWindow, 90*time.Millisecond)
					}
				} else {
					require.Positive(t, r.RSSBeforeKB)
					require.Positive(t, r.RSSAfterKB)
					if hub == HubTaskrunner {
						require.Equal(t, n, r.OpenAtServer, "the gateway had every stream open when its memory was read")
					}
				}
				results = append(results, r)
			})
		}
	}
	require.Len(t, SSEPairs(results), 4, "each scenario ran on both hubs")
}

// TestCopies checks the per-event first and last copy: each event's
// fastest and slowest subscriber of its own task, leaving out subscribers
// whose latencies do not line up with the events (one missed an event).
func TestCopies(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	c := &sseRun{spec: SSESpec{Tasks: []SSETask{{ID: "a"}, {ID: "b"}}}, sc: SSEScenario{Events: 2}}
	c.subs = []*subscriber{
		{want: 2, lat: ms(5, 7)},         // task a
		{want: 2, lat: ms(1, 30)},        // task b
		{want: 2, lat: ms(9, 2)},         // task a
		{want: 2, lat: ms(100), gaps: 1}, // task b, missed one: left out
		{want: 2, lat: ms(3, 4)},         // task a
	}
	first, last := c.copies()
	// a: event 1 from 3 to 9 ms, event 2 from 2 to 7; b: 1 and 30.
	// Firsts 1 2 3 30, lasts 1 7 9 30 (nearest-rank p50: the second).
	require.Equal(t, 4, first.N, "two events of two tasks")
	require.Equal(t, 4, last.N)
	require.Equal(t, 2*time.Millisecond, first.P50)
	require.Equal(t, 7*time.Millisecond, last.P50)
	require.Equal(t, 30*time.Millisecond, first.Max)
	require.Equal(t, 30*time.Millisecond, last.Max)
}

// TestSubscriberCounts checks the loss and duplicate accounting that the
// benchmark's verdict rests on.
func TestSubscriberCounts(t *testing.T) {
	now := time.Now()
	s := &subscriber{want: 6}
	for _, id := range []string{"1", "2", "2", "4@task", "3", "5"} {
		s.received(id, "log", now)
	}
	require.Equal(t, int64(4), s.delivered, "1, 2, 4 and 5")
	require.Equal(t, int64(2), s.dups, "2 again, and 3 after 4")
	require.Equal(t, int64(1), s.gaps, "3 skipped")
	require.Equal(t, int64(5), s.last.Load())
	require.Equal(t, "5", s.lastID)
	require.Zero(t, s.lastAt.Load(), "6 not yet received")
	s.received("6@task", "log", now)
	require.Positive(t, s.lastAt.Load())
	require.Equal(t, "6@task", s.lastID, "Last-Event-ID is the id as received")
	s.received("x", "log", now)
	require.Error(t, s.firstErr)

	// The timeline's control-plane events keep the ids gap-free but are
	// not deliveries: runner event n arrives with a later id.
	tl := &subscriber{want: 2}
	for _, e := range [][2]string{{"1", "status_change"}, {"2", "status_change"}, {"3", "sandbox"}, {"4", "log"}, {"5", "log"}, {"6", "status_change"}} {
		tl.received(e[0], e[1], now)
	}
	require.Equal(t, int64(2), tl.delivered)
	require.Zero(t, tl.gaps)
	require.Zero(t, tl.dups)
	require.Equal(t, int64(2), tl.last.Load())
	require.Positive(t, tl.lastAt.Load())
	require.Equal(t, "6", tl.lastID)
}

func TestSSEGoals(t *testing.T) {
	fan := func(hub string, delivered int64, window, p99 time.Duration) SSEResult {
		return SSEResult{SSEScenario: SSEScenario{Name: "1×1000 seq", Hub: hub, Kind: KindFanout, Tasks: 1, Subs: 1000, Events: 10},
			SSEClientResult: SSEClientResult{Delivered: delivered, Expected: delivered, Window: window, Latency: Latencies{P99: p99}}}
	}
	idle := func(hub string, before, after int64, cpu, pg time.Duration) SSEResult {
		return SSEResult{SSEScenario: SSEScenario{Name: "idle 10000", Hub: hub, Kind: KindIdle, Tasks: 1000, Subs: 10},
			RSSBeforeKB: before, RSSAfterKB: after, ServerCPU: cpu, PGRedisCPU: pg}
	}
	results := []SSEResult{
		fan(HubTaskrunner, 10000, time.Second, 10*time.Millisecond), fan(HubMercure, 4000, time.Second, 30*time.Millisecond),
		idle(HubTaskrunner, 1000, 1000+150000, time.Second, time.Second), idle(HubMercure, 1000, 1000+300000, 2*time.Second, time.Second),
	}
	v := SSEGoals(results)
	require.True(t, v[0].Run && v[0].Pass, v[0].Measured)
	require.True(t, v[1].Run && v[1].Pass, "15 KiB/conn, 0.5× Mercure's: %s", v[1].Measured)
	require.True(t, v[2].Run && v[2].Pass, "2 s (pg counted for taskrunner only) vs 2 s: %s", v[2].Measured)
	require.InDelta(t, 15.0, results[2].RSSPerConnKiB(), 1e-9)

	results[0].Latency.P99 = 20 * time.Millisecond // 0.67× Mercure's p99
	results[2].RSSAfterKB = 1000 + 210000          // 21 KiB
	results[2].PGRedisCPU = 3 * time.Second        // 4 s: 2×
	v = SSEGoals(results)
	require.False(t, v[0].Pass)
	require.False(t, v[1].Pass)
	require.False(t, v[2].Pass)
	results[0].Latency.P99 = 10 * time.Millisecond
	results[0].Lost = 1
	require.False(t, SSEGoals(results)[0].Pass, "a lost event fails the goal")
	require.False(t, SSEGoals(results[:1])[0].Run, "no Mercure result: not run")
}
