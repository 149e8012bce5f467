package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

// Design names.
const (
	DesignNew      = "new (gRPC mTLS stream)"
	DesignBaseline = "baseline (HMAC POST)"
)

// Scenario is one measured run.
type Scenario struct {
	Design  string
	RTT     time.Duration // added round trip between runners and server
	Runners int           // one task each
	Events  int           // per runner
	SSE     int           // SSE clients, spread over the tasks
	// Rate paces the runners at this many events/s in total; 0 sends as
	// fast as the design allows (the throughput runs).
	Rate float64
	// Cap bounds the run: runners send nothing new after it, and a run
	// that has not been fully acknowledged by then is measured over it.
	Cap time.Duration
	// Drain bounds the wait for SSE clients to receive every
	// acknowledged event after the run.
	Drain time.Duration
	// DiffEvery makes every DiffEvery-th event a diff_stats report (0:
	// none). Each one is a task update in the new design's transaction.
	DiffEvery int
}

// Result is what a Scenario measured.
type Result struct {
	Scenario
	Target     int64         // events the runners were to send
	Acked      int64         // events acknowledged within the window
	Window     time.Duration // start to last ack, or Cap
	Capped     bool          // the window ended at Cap with events left
	Errors     int64         // events the baseline's server refused or that failed
	Latency    Latencies     // runner send → SSE receive, every client's copy
	AckLatency Latencies     // runner send → acknowledgement (1 ms resolution for the new design)
	Delivered  int64         // SSE messages received (all clients)
	Missing    int64         // acknowledged events some client never got
	Reconnects int64         // SSE reconnects (slow-client cut-offs and errors)
	CPU        time.Duration // this process, user+sys, start to drain end
	ServerCPU  time.Duration // local postgres + redis-server processes, same window
	PeakRSSKB  int64         // VmHWM of this process during the run
	SSEErr     string        // the first SSE stream error, if any
}

// EventsPerSec is the acknowledged throughput over the window.
func (r Result) EventsPerSec() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Acked) / r.Window.Seconds()
}

// CPUPer1k is process CPU seconds per 1,000 acknowledged events.
func (r Result) CPUPer1k() float64 {
	if r.Acked == 0 {
		return 0
	}
	return r.CPU.Seconds() / float64(r.Acked) * 1000
}

// ServerCPUPer1k is PostgreSQL + Redis CPU seconds per 1,000 events.
func (r Result) ServerCPUPer1k() float64 {
	if r.Acked == 0 {
		return 0
	}
	return r.ServerCPU.Seconds() / float64(r.Acked) * 1000
}

const logFiller = "tool_use Edit src/widgets/widget.go: applied 3 hunks; $ go test ./widgets/... -run TestWidget -count=1 → ok  github.com/acme/widgets/widgets 0.412s; reading internal/config/config.go for the flag defaults ......................................"

// workloadEvent is runner r's i-th of n events: the four stages in order
// at 0, n/4, n/2 and 3n/4, diff stats every diffEvery-th event, and
// ~200-byte log tails otherwise. No terminal event: the tasks stay running.
func workloadEvent(r, i, n, diffEvery int) *taskrunnerv1.Event {
	stage := map[int]taskrunnerv1.TaskStage{0: taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE, n / 4: taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE,
		n / 2: taskrunnerv1.TaskStage_TASK_STAGE_APPLY, 3 * n / 4: taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE}
	if s, ok := stage[i]; ok && (i == 0 || n >= 4) {
		return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: s}}}
	}
	if diffEvery > 0 && i%diffEvery == diffEvery/2 {
		return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{
			Additions: int64(3 * i), Deletions: int64(i), FilesChanged: int64(i/50 + 1)}}}
	}
	line := fmt.Sprintf("[r%03d #%06d] ", r, i) + logFiller
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{line[:min(len(line), 200)]}}}}
}

// Run performs one scenario on fresh running tasks.
func (e *Env) Run(ctx context.Context, sc Scenario) (Result, error) {
	res := Result{Scenario: sc, Target: int64(sc.Runners) * int64(sc.Events)}
	ids, err := e.runningTasks(ctx, sc.Runners)
	if err != nil {
		return res, err
	}

	target := e.GRPCAddr
	if sc.Design == DesignBaseline {
		target = e.BaseAddr
	}
	if sc.RTT > 0 {
		p, err := NewDelayProxy(target, sc.RTT)
		if err != nil {
			return res, err
		}
		defer p.Close()
		target = p.Addr()
	}

	// SSE clients first, each connected (its Redis subscription confirmed)
	// before any event is sent.
	wctx, stopWatchers := context.WithCancel(ctx)
	defer stopWatchers()
	sseTransport := &http.Transport{MaxIdleConnsPerHost: sc.SSE + 1, DisableCompression: true}
	defer sseTransport.CloseIdleConnections()
	sseClient := &http.Client{Transport: sseTransport}
	watchers := make([]*watcher, sc.SSE)
	watched := make([]int, sc.SSE) // runner index of each watcher
	var ready sync.WaitGroup
	var wwg sync.WaitGroup
	for i := range watchers {
		watched[i] = i % sc.Runners
		w := &watcher{client: sseClient, url: e.SSEURL + "/v1/tasks/" + ids[watched[i]] + "/events", token: e.Token}
		watchers[i] = w
		ready.Add(1)
		wwg.Go(func() { w.run(wctx, ready.Done) })
	}
	if err := waitGroupTimeout(&ready, 60*time.Second); err != nil {
		stopWatchers()
		wwg.Wait()
		return res, fmt.Errorf("SSE clients did not connect: %w", err)
	}
	defer func() { stopWatchers(); wwg.Wait() }()

	// The new design's runners connect (TLS handshake, Hello, Welcome)
	// before the clock starts, as a real runner does long before its agent
	// produces events; the baseline's connections are opened by its first
	// requests, which its long runs make negligible.
	var clients []*eventsclient.Client
	if sc.Design == DesignNew {
		clients, err = e.connectNew(ctx, sc, ids, target)
		defer closeClients(clients)
		if err != nil {
			return res, err
		}
	}

	runtime.GC()
	debug.FreeOSMemory()
	if !resetPeakRSS() {
		e.log.Warn("bench: cannot reset VmHWM; peak memory is the process's peak so far")
	}
	cpu0, srv0 := cpuTime(), serverCPU("postgres", "redis-server")
	start := time.Now()
	deadline := start.Add(sc.Cap)

	var lastSeq []func() int64 // per runner: highest acknowledged seq
	var end time.Time
	switch sc.Design {
	case DesignNew:
		lastSeq, end, err = e.runNew(ctx, sc, clients, start, deadline, &res)
	case DesignBaseline:
		lastSeq, end, err = e.runBaseline(ctx, sc, ids, target, start, deadline, &res)
	default:
		err = fmt.Errorf("unknown design %q", sc.Design)
	}
	if err != nil {
		return res, err
	}
	res.Window = end.Sub(start)

	// Drain: every client should get every acknowledged event of its task.
	want := make([]int64, sc.Runners)
	for r := range want {
		want[r] = lastSeq[r]()
	}
	drainBy := time.Now().Add(sc.Drain)
	for time.Now().Before(drainBy) {
		all := true
		for i, w := range watchers {
			if w.last.Load() < want[watched[i]] {
				all = false
				break
			}
		}
		if all {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.CPU = cpuTime() - cpu0
	res.ServerCPU = serverCPU("postgres", "redis-server") - srv0
	res.PeakRSSKB = procStatusKB("VmHWM")
	stopWatchers()
	wwg.Wait()

	var lat []time.Duration
	timeline := map[int][]time.Duration{}
	for i, w := range watchers {
		w.mu.Lock()
		lat = append(lat, w.lat...)
		for j, at := range w.recvAt {
			b := int(at.Sub(start) / (500 * time.Millisecond))
			timeline[b] = append(timeline[b], w.lat[j])
		}
		if res.SSEErr == "" && len(w.errs) > 0 {
			res.SSEErr = w.errs[0].Error()
		}
		w.mu.Unlock()
		res.Delivered += int64(len(w.lat))
		res.Reconnects += w.reconnects.Load()
		res.Missing += max(want[watched[i]]-w.last.Load(), 0)
	}
	res.Latency = Summarise(lat)
	if os.Getenv("BENCH_TIMELINE") != "" {
		for b := 0; b < 60; b++ {
			if l, ok := timeline[b]; ok {
				s := Summarise(l)
				fmt.Fprintf(os.Stderr, "  t=%4.1fs n=%6d p50 %6.1f p99 %6.1f max %6.1f\n", float64(b)/2, len(l), float64(s.P50)/1e6, float64(s.P99)/1e6, float64(s.Max)/1e6)
			}
		}
	}
	return res, nil
}

// pace returns runner r's send time of its i-th event, or zero when the
// scenario is not paced. Runners start at random phases so their sends
// do not line up.
func pacer(sc Scenario, start time.Time) func(r, i int) time.Time {
	if sc.Rate <= 0 {
		return func(int, int) time.Time { return time.Time{} }
	}
	interval := time.Duration(float64(sc.Runners) / sc.Rate * float64(time.Second))
	phase := make([]time.Duration, sc.Runners)
	for r := range phase {
		phase[r] = rand.N(interval + 1)
	}
	return func(r, i int) time.Time { return start.Add(phase[r] + time.Duration(i)*interval) }
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// connectNew starts one eventsclient per task (each its own mTLS
// connection and task certificate) and waits until every one is welcomed.
func (e *Env) connectNew(ctx context.Context, sc Scenario, ids []string, addr string) ([]*eventsclient.Client, error) {
	clients := make([]*eventsclient.Client, 0, len(ids))
	for _, id := range ids {
		tlsCfg, err := e.runnerTLS(id)
		if err != nil {
			return clients, err
		}
		c, err := eventsclient.New(eventsclient.Config{Addr: "passthrough:///" + addr, TLS: tlsCfg, TaskID: id,
			RunnerVersion: "bench", Logger: e.log, BufferSize: sc.Events + 16,
			MinBackoff: 20 * time.Millisecond, MaxBackoff: time.Second})
		if err != nil {
			return clients, err
		}
		clients = append(clients, c)
		c.Start(ctx)
	}
	timeout := time.After(60 * time.Second)
	for _, c := range clients {
		select {
		case <-c.Connected():
		case <-c.Done():
			return clients, fmt.Errorf("a runner's stream ended before it was welcomed: %v", c.Err())
		case <-timeout:
			return clients, errors.New("the runners' streams were not welcomed within 60s")
		case <-ctx.Done():
			return clients, ctx.Err()
		}
	}
	return clients, nil
}

// closeClients flushes what is left (bounded) and frees the connections.
func closeClients(clients []*eventsclient.Client) {
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			fctx, fcancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer fcancel()
			_ = c.Close(fctx)
		})
	}
	wg.Wait()
}

// runNew streams through the connected clients and returns when every sent
// event is acknowledged or at the deadline.
func (e *Env) runNew(ctx context.Context, sc Scenario, clients []*eventsclient.Client, start, deadline time.Time, res *Result) ([]func() int64, time.Time, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	at := pacer(sc, start)
	var sent atomic.Int64
	var sending sync.WaitGroup
	var sendErr atomic.Value
	sentAt := make([][]atomic.Int64, len(clients)) // unix nanos of each seq's Send
	for r := range sentAt {
		sentAt[r] = make([]atomic.Int64, sc.Events+1)
	}
	for r, c := range clients {
		sending.Go(func() {
			for i := range sc.Events {
				if t := at(r, i); !t.IsZero() {
					if sleepUntil(cctx, t) != nil {
						return
					}
				}
				if time.Now().After(deadline) {
					return
				}
				ev := workloadEvent(r, i, sc.Events, sc.DiffEvery)
				now := time.Now()
				ev.Time = timestamppb.New(now)
				sentAt[r][i+1].Store(now.UnixNano())
				if _, err := c.Send(ev); err != nil {
					sendErr.CompareAndSwap(nil, err)
					return
				}
				sent.Add(1)
			}
		})
	}
	sendersDone := make(chan struct{})
	go func() { sending.Wait(); close(sendersDone) }()

	// acked sums the clients' acknowledged seqs and records, for each newly
	// acknowledged seq, its send-to-ack latency (as seen by this 1 ms poll).
	seen := make([]int64, len(clients))
	var ackLat []time.Duration
	acked := func() int64 {
		var n int64
		now := time.Now().UnixNano()
		for r, c := range clients {
			a := min(c.Acked(), int64(sc.Events))
			for seq := seen[r] + 1; seq <= a; seq++ {
				if t := sentAt[r][seq].Load(); t > 0 {
					ackLat = append(ackLat, time.Duration(now-t))
				}
			}
			seen[r] = max(seen[r], a)
			n += a
		}
		return n
	}
	var end time.Time
	for {
		finished := false
		select {
		case <-sendersDone:
			finished = true
		default:
		}
		n := acked()
		now := time.Now()
		if finished && n >= sent.Load() {
			res.Acked, end = n, now
			break
		}
		if now.After(deadline) {
			res.Acked, end, res.Capped = n, deadline, true
			break
		}
		if err := ctx.Err(); err != nil {
			return nil, time.Time{}, err
		}
		time.Sleep(time.Millisecond)
	}
	res.AckLatency = Summarise(ackLat)
	cancel() // stops pacing; the deferred Close still flushes
	<-sendersDone
	if v := sendErr.Load(); v != nil {
		res.Errors++
		e.log.Warn("bench: a runner's Send failed", "error", v)
	}
	last := make([]func() int64, len(clients))
	for r, c := range clients {
		last[r] = c.Acked
	}
	return last, end, nil
}

// runBaseline posts every event and waits for each answer, sequentially
// per runner, until done or the deadline.
func (e *Env) runBaseline(ctx context.Context, sc Scenario, ids []string, addr string, start, deadline time.Time, res *Result) ([]func() int64, time.Time, error) {
	tr := e.newBaselineTransport(addr, sc.Runners)
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	at := pacer(sc, start)
	lastOK := make([]atomic.Int64, sc.Runners)
	var acked, failed atomic.Int64
	ackLat := make([][]time.Duration, sc.Runners)
	var wg sync.WaitGroup
	for r, id := range ids {
		c := &baselineClient{http: hc, url: "https://" + addr + baselinePath, taskID: id, secret: callbackSecret(e.Baseline.key, id)}
		wg.Go(func() {
			for i := range sc.Events {
				if t := at(r, i); !t.IsZero() {
					if sleepUntil(ctx, t) != nil {
						return
					}
				}
				if time.Now().After(deadline) || ctx.Err() != nil {
					return
				}
				ev := workloadEvent(r, i, sc.Events, sc.DiffEvery)
				ev.Seq = int64(i + 1)
				sentAt := time.Now()
				ev.Time = timestamppb.New(sentAt)
				if err := c.post(ctx, ev); err != nil {
					if failed.Add(1) == 1 {
						e.log.Warn("bench: baseline post failed", "error", err)
					}
					continue
				}
				ackLat[r] = append(ackLat[r], time.Since(sentAt))
				acked.Add(1)
				lastOK[r].Store(ev.Seq)
			}
		})
	}
	wg.Wait()
	end := time.Now()
	res.Acked, res.Errors = acked.Load(), failed.Load()
	var all []time.Duration
	for _, l := range ackLat {
		all = append(all, l...)
	}
	res.AckLatency = Summarise(all)
	res.Capped = res.Acked < res.Target && !end.Before(deadline)
	last := make([]func() int64, sc.Runners)
	for r := range last {
		last[r] = lastOK[r].Load
	}
	return last, end, nil
}

func waitGroupTimeout(wg *sync.WaitGroup, d time.Duration) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(d):
		return errors.New("timed out after " + d.String())
	}
}

// shortDesign is the design's first word, for compact tables.
func shortDesign(d string) string { name, _, _ := strings.Cut(d, " "); return name }
