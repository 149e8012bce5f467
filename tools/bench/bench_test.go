package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// clientEnv makes this test binary the benchmark's client process (see
// TestScenariosEndToEnd).
const clientEnv = "TASKRUNNER_BENCH_TEST_CLIENT"

func TestMain(m *testing.M) {
	// "1": bench-events' client process; "sse": bench-sse's.
	if mode := os.Getenv(clientEnv); mode != "" {
		run := RunClient
		if mode == "sse" {
			run = RunSSEClient
		}
		if err := run(context.Background(), os.Stdin, os.Stdout, slog.New(slog.DiscardHandler)); err != nil {
			fmt.Fprintln(os.Stderr, "bench client:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestScenariosEndToEnd runs small scenarios of both designs, and a paced
// one, through the real parent/child protocol against the real PostgreSQL
// and Redis: every event is acknowledged and stored once, every SSE client
// gets every event of its task, and the measurements are filled in.
func TestScenariosEndToEnd(t *testing.T) {
	ctx := context.Background()
	env, err := NewEnv(ctx, EnvOptions{BaselineConns: 2, Logger: slog.New(slog.DiscardHandler), ClientCommand: []string{os.Args[0], "-test.run=^$"}})
	if err != nil {
		if os.Getenv("TASKRUNNER_REQUIRE_SERVICES") != "" {
			t.Fatalf("PostgreSQL and Redis are required: %v", err)
		}
		t.Skipf("PostgreSQL or Redis unavailable: %v", err)
	}
	defer env.Close()
	t.Setenv(clientEnv, "1") // inherited by the client processes
	base := Scenario{Runners: 2, Events: 40, SSE: 3, Cap: 20 * time.Second, Drain: 10 * time.Second, DiffEvery: 10}
	for _, sc := range []Scenario{
		{Design: DesignNew},
		{Design: DesignBaseline},
		{Design: DesignNew, Rate: 200},
		{Design: DesignNew, RTT: 20 * time.Millisecond},
	} {
		sc.Runners, sc.Events, sc.SSE, sc.Cap, sc.Drain, sc.DiffEvery = base.Runners, base.Events, base.SSE, base.Cap, base.Drain, base.DiffEvery
		t.Run(fmt.Sprintf("%s rate %.0f rtt %s", shortDesign(sc.Design), sc.Rate, sc.RTT), func(t *testing.T) {
			r, err := env.Run(ctx, sc)
			require.NoError(t, err)
			require.Equal(t, int64(80), r.Target)
			require.Equal(t, r.Target, r.Acked, "every event acknowledged")
			require.False(t, r.Capped)
			require.Zero(t, r.Errors)
			require.Zero(t, r.Missing, "every SSE client got every event of its task")
			require.Equal(t, int64(3*40), r.Delivered) // two clients on task 0, one on task 1
			require.Equal(t, 120, r.Latency.N)
			require.Positive(t, r.Latency.P50)
			require.Equal(t, 80, r.AckLatency.N)
			require.Positive(t, r.Window)
			require.Positive(t, r.CPU)
			require.Positive(t, r.ClientCPU)
			if sc.RTT > 0 {
				require.GreaterOrEqual(t, r.AckLatency.P50, sc.RTT, "acks waited for the added round trip")
			}
		})
	}
	var stored int64
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM task_events WHERE runner_seq IS NOT NULL`).Scan(&stored))
	require.Equal(t, int64(4*80), stored, "each event stored once")

	// The physical reference stores the same rows as the new design does,
	// in transactions of ReferenceBatch rows: 2 × 250 rows, 3 transactions
	// per writer.
	ref := base
	ref.Design, ref.Events, ref.SSE = DesignReference, 250, 0
	r, err := env.Run(ctx, ref)
	require.NoError(t, err)
	require.Equal(t, int64(500), r.Acked)
	require.False(t, r.Capped)
	require.Positive(t, r.Window)
	require.Positive(t, r.EventsPerSec())
	require.Equal(t, 6, r.AckLatency.N, "one latency per transaction")
	var refRows, refTasks, badSeqs int64
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT task_id) FROM task_events WHERE runner_seq IS NOT NULL`).Scan(&refRows, &refTasks))
	require.Equal(t, int64(4*80+500), refRows)
	require.Equal(t, int64(4*2+2), refTasks)
	// Each reference task's timeline continues its control-plane events
	// without a gap, and the payloads carry their seq, as the new design's.
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM task_events e
		WHERE e.payload->>'seq' <> e.seq::text OR e.seq <> (SELECT count(*) FROM task_events p WHERE p.task_id = e.task_id AND p.seq <= e.seq)`).Scan(&badSeqs))
	require.Zero(t, badSeqs)
}

func TestGoalsJudgeIngestBesideTheReference(t *testing.T) {
	ingest := func(results []Result) Verdict { return Goals(results)[2] }
	require.False(t, ingest(nil).Run, "no unpaced run without added rtt: not run")

	fast := Result{Scenario: Scenario{Design: DesignNew, Runners: 50, SSE: 200}, Acked: 110_000, Window: 2 * time.Second}
	ref := Result{Scenario: Scenario{Design: DesignReference, Runners: 50}, Acked: 100_000, Window: time.Second}
	paced := Result{Scenario: Scenario{Design: DesignNew, Rate: GoalRate, Runners: 50, SSE: GoalSSEClients}, Acked: 50_000, Window: 10 * time.Second}
	v := ingest([]Result{paced, ref, fast})
	require.True(t, v.Run)
	require.True(t, v.Pass)
	require.Contains(t, v.Goal, "50,000")
	require.Contains(t, v.Measured, "55000 acked ev/s")
	require.Contains(t, v.Measured, "reference in the same run 100000 rows/s, new÷reference 0.55×")

	slow := fast
	slow.Window = 3 * time.Second
	require.False(t, ingest([]Result{slow}).Pass)
	lost := fast
	lost.Missing = 1
	require.False(t, ingest([]Result{lost}).Pass, "an event lost fails the goal")
	capped := fast
	capped.Capped = true
	require.False(t, ingest([]Result{capped}).Pass, "a run that did not finish fails the goal")
	delayed := fast
	delayed.RTT = GoalRatioRTT
	require.False(t, ingest([]Result{delayed}).Run, "only the run without added rtt counts")

	var out strings.Builder
	WriteRatios(&out, []Result{ref, fast})
	require.Contains(t, out.String(), "new÷reference 0.55×")
	require.Equal(t, "1,234,567", thousands(1234567))
	require.Equal(t, "999", thousands(999))
}

func TestSweepSummary(t *testing.T) {
	point := func(committers, round int, evs, p99ms int64) SweepPoint {
		return SweepPoint{Committers: committers, Round: round, Cores: 2, Results: []Result{
			{Scenario: Scenario{Design: DesignNew, Rate: 100}, Acked: 1000, Window: 10 * time.Second, Latency: Latencies{P99: time.Duration(p99ms) * time.Millisecond}},
			{Scenario: Scenario{Design: DesignNew, Rate: 100}, Acked: 1000, Window: 10 * time.Second, Latency: Latencies{P99: time.Duration(p99ms+10) * time.Millisecond}},
			{Scenario: Scenario{Design: DesignNew, Rate: 100}, Acked: 1000, Window: 10 * time.Second, Latency: Latencies{P99: time.Duration(p99ms-5) * time.Millisecond}},
			{Scenario: Scenario{Design: DesignNew}, Acked: evs, Window: time.Second},
		}}
	}
	points := []SweepPoint{point(1, 1, 40000, 20), point(2, 1, 50000, 30), point(1, 2, 42000, 22), point(2, 2, 54000, 40)}
	require.Equal(t, []SweepRow{
		{Cores: 2, Committers: 1, EventsPerSec: 41000, PacedP99: 21 * time.Millisecond},
		{Cores: 2, Committers: 2, EventsPerSec: 52000, PacedP99: 35 * time.Millisecond},
	}, SweepSummary(points))
	var out strings.Builder
	WriteSweep(&out, points)
	require.Contains(t, out.String(), "20.0; 20.0, 30.0, 15.0")
	require.Equal(t, 3*time.Millisecond, median([]time.Duration{5 * time.Millisecond, time.Millisecond, 3 * time.Millisecond}))
}

func TestPercentile(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name string
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{"empty", nil, 99, 0},
		{"single", ms(7), 50, 7 * time.Millisecond},
		{"p50 of 1..100", ms(hundred...), 50, 50 * time.Millisecond},
		{"p95 of 1..100", ms(hundred...), 95, 95 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p100 of 1..100", ms(hundred...), 100, 100 * time.Millisecond},
		{"p99 of 10 is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p50 of 4 is the 2nd", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p0 is the min", ms(3, 4), 0, 3 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Percentile(tc.in, tc.p))
		})
	}
	l := Summarise(ms(5, 1, 4, 2, 3))
	require.Equal(t, Latencies{N: 5, P50: 3 * time.Millisecond, P95: 5 * time.Millisecond, P99: 5 * time.Millisecond, Max: 5 * time.Millisecond}, l)
}

func TestSignVerify(t *testing.T) {
	secret := []byte("task secret")
	body := []byte(`{"task_id":"t","event":{}}`)
	sig := Sign(secret, 1700000000, body)
	require.Regexp(t, `^sha256=[0-9a-f]{64}$`, sig)
	require.True(t, Verify(secret, 1700000000, body, sig))
	require.False(t, Verify([]byte("other secret"), 1700000000, body, sig), "another task's secret")
	require.False(t, Verify(secret, 1700000001, body, sig), "the timestamp is signed")
	require.False(t, Verify(secret, 1700000000, []byte(`{"task_id":"u","event":{}}`), sig), "the body is signed")
	require.False(t, Verify(secret, 1700000000, body, ""), "no signature")
	require.NotEqual(t, callbackSecret([]byte("k"), "a"), callbackSecret([]byte("k"), "b"))
}

func TestEventTimeReadsProtojson(t *testing.T) {
	when := time.Date(2026, 3, 4, 5, 6, 7, 891011121, time.UTC)
	b, err := eventwire.EncodeEvent(&taskrunnerv1.Event{Seq: 3, Time: timestamppb.New(when),
		Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{`a "time": "1999-01-01T00:00:00Z" look-alike`}}}})
	require.NoError(t, err)
	got, err := EventTime(b)
	require.NoError(t, err)
	require.True(t, when.Equal(got), "got %s", got)

	got, err = EventTime([]byte(`{"seq":"1", "time": "2026-01-02T03:04:05.5Z"}`))
	require.NoError(t, err)
	require.True(t, time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.UTC).Equal(got))

	_, err = EventTime([]byte(`{"seq":"1"}`))
	require.Error(t, err)
}

func TestWorkloadOrder(t *testing.T) {
	var stages []taskrunnerv1.TaskStage
	logs, diffs := 0, 0
	for i := range 400 {
		ev := workloadEvent(1, i, 400, 100)
		switch p := ev.GetPayload().(type) {
		case *taskrunnerv1.Event_StageChange:
			stages = append(stages, p.StageChange.GetStage())
		case *taskrunnerv1.Event_DiffStats:
			diffs++
		case *taskrunnerv1.Event_Log:
			logs++
			require.Len(t, p.Log.GetLines()[0], 200)
		}
	}
	require.Equal(t, []taskrunnerv1.TaskStage{taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE, taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
		taskrunnerv1.TaskStage_TASK_STAGE_APPLY, taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE}, stages)
	require.Equal(t, 4, diffs)
	require.Equal(t, 392, logs)
}

func TestStatTicks(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime …
	line := "42 (postgres) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 100 1000 10"
	require.Equal(t, int64(300), statTicks(line, []string{"postgres"}))
	require.Zero(t, statTicks(line, []string{"redis-server"}))
	require.Equal(t, int64(3), statTicks("7 (redis-server) R 1 7 7 0 -1 0 0 0 0 0 1 2 0", []string{"postgres", "redis-server"}))
}

func TestDelayProxyAddsRoundTrip(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echoed := make(chan struct{})
	go func() {
		defer close(echoed)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	const rtt = 40 * time.Millisecond
	p, err := NewDelayProxy(ln.Addr().String(), rtt)
	require.NoError(t, err)
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	rd := bufio.NewReader(c)
	for i := range 3 {
		start := time.Now()
		_, err := fmt.Fprintf(c, "ping %d\n", i)
		require.NoError(t, err)
		line, err := rd.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, fmt.Sprintf("ping %d\n", i), line)
		took := time.Since(start)
		require.GreaterOrEqual(t, took, rtt, "round trip %d", i)
		require.Less(t, took, rtt+time.Second, "round trip %d", i)
	}
	require.NoError(t, c.Close())
	p.Close()
	require.NoError(t, ln.Close())
	<-echoed
}

func TestSchedLatencies(t *testing.T) {
	inf := math.Inf(1)
	buckets := []float64{0, 0.001, 0.002, 0.004, inf}
	a := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5, 0, 0, 0}}
	b := &metrics.Float64Histogram{Buckets: buckets, Counts: []uint64{5 + 90, 9, 1, 0}}
	l := schedLatencies(a, b)
	require.Equal(t, 100, l.N, "only what happened between the samples")
	require.Equal(t, time.Millisecond, l.P50)
	require.Equal(t, 2*time.Millisecond, l.P95)
	require.Equal(t, 4*time.Millisecond, l.P99)
	require.Equal(t, 4*time.Millisecond, l.Max)
	b.Counts[3] = 1 // one in the open bucket: reported by its lower bound
	require.Equal(t, 4*time.Millisecond, schedLatencies(a, b).Max)
	require.Zero(t, schedLatencies(a, a).N)
}
