package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
)

// Design names.
const (
	DesignNew      = "new (gRPC mTLS stream)"
	DesignBaseline = "baseline (HMAC POST)"
	// DesignReference is the physical reference (physical.go): the same
	// rows by plain pgx.Batch inserts.
	DesignReference = "pgx.Batch reference"
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
	CPU        time.Duration // the server process, user+sys, start to drain end
	ClientCPU  time.Duration // the client process (runners, SSE clients, proxy), same window
	ServerCPU  time.Duration // local postgres + redis-server processes, same window
	PeakRSSKB  int64         // VmHWM of the server process during the run
	Sched      Latencies     // the server process's Go scheduler latency (runnable → running)
	Host       HostShares    // the host's idle and stolen CPU over the window
	SSEErr     string        // the first SSE stream error, if any
}

// EventsPerSec is the acknowledged throughput over the window.
func (r Result) EventsPerSec() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Acked) / r.Window.Seconds()
}

// CPUPer1k is the server process's CPU seconds per 1,000 acknowledged
// events.
func (r Result) CPUPer1k() float64 { return per1k(r.CPU, r.Acked) }

// ClientCPUPer1k is the client process's CPU seconds per 1,000 events.
func (r Result) ClientCPUPer1k() float64 { return per1k(r.ClientCPU, r.Acked) }

func per1k(d time.Duration, n int64) float64 {
	if n == 0 {
		return 0
	}
	return d.Seconds() / float64(n) * 1000
}

// ServerCPUPer1k is PostgreSQL + Redis CPU seconds per 1,000 events.
func (r Result) ServerCPUPer1k() float64 { return per1k(r.ServerCPU, r.Acked) }

const logFiller = "tool_use Edit src/widgets/widget.go: applied 3 hunks; $ go test ./widgets/... -run TestWidget -count=1 → ok  github.com/acme/widgets/widgets 0.412s; reading internal/config/config.go for the flag defaults ......................................"

// workloadEvent is runner r's i-th of n events: the four stages in order
// at 0, n/4, n/2 and 3n/4, diff stats every diffEvery-th event, and
// ~200-byte log tails otherwise. No terminal event: the tasks stay running.
func workloadEvent(r, i, n, diffEvery int) *taskrunnerv1.Event {
	// Below 4 events the quarters coincide: only the first stage is sent.
	var s taskrunnerv1.TaskStage
	switch {
	case i == 0:
		s = taskrunnerv1.TaskStage_TASK_STAGE_EXPLORE
	case n < 4:
	case i == n/4:
		s = taskrunnerv1.TaskStage_TASK_STAGE_PROPOSE
	case i == n/2:
		s = taskrunnerv1.TaskStage_TASK_STAGE_APPLY
	case i == 3*n/4:
		s = taskrunnerv1.TaskStage_TASK_STAGE_ARCHIVE
	}
	if s != taskrunnerv1.TaskStage_TASK_STAGE_UNSPECIFIED {
		return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_StageChange{StageChange: &taskrunnerv1.StageChange{Stage: s}}}
	}
	if diffEvery > 0 && i%diffEvery == diffEvery/2 {
		return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_DiffStats{DiffStats: &taskrunnerv1.DiffStats{
			Additions: int64(3 * i), Deletions: int64(i), FilesChanged: int64(i/50 + 1)}}}
	}
	line := fmt.Sprintf("[r%03d #%06d] ", r, i) + logFiller
	return &taskrunnerv1.Event{Payload: &taskrunnerv1.Event_Log{Log: &taskrunnerv1.Log{Lines: []string{line[:min(len(line), 200)]}}}}
}

// Run performs one scenario on fresh running tasks: this process serves,
// a child process (EnvOptions.ClientCommand running RunClient) plays the
// runners and the SSE clients. The physical reference (DesignReference)
// runs in this process instead (see runReference).
func (e *Env) Run(ctx context.Context, sc Scenario) (Result, error) {
	if sc.Design == DesignReference {
		return e.runReference(ctx, sc) // in this process: no client process, no added rtt
	}
	res := Result{Scenario: sc, Target: int64(sc.Runners) * int64(sc.Events)}
	if len(e.clientCmd) == 0 {
		return res, errors.New("bench: no client command to run the clients with")
	}
	ids, err := e.runningTasks(ctx, sc.Runners)
	if err != nil {
		return res, err
	}
	spec := ClientSpec{Scenario: sc, Target: e.GRPCAddr, CAPEM: e.CA.CertPEM(), SSEURL: e.SSEURL, Token: e.Token}
	if sc.Design == DesignBaseline {
		spec.Target = e.BaseAddr
	}
	for _, id := range ids {
		t := ClientTask{ID: id}
		if sc.Design == DesignBaseline {
			t.Secret = callbackSecret(e.Baseline.key, id)
		} else if t.CertPEM, t.KeyPEM, err = e.CA.MintTaskCert(id, time.Now().Add(time.Hour)); err != nil {
			return res, err
		}
		spec.Tasks = append(spec.Tasks, t)
	}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return res, err
	}

	cp, err := startClient(ctx, e.clientCmd)
	if err != nil {
		return res, err
	}
	defer cp.stop()
	if err := cp.say(string(specJSON)); err != nil {
		return res, err
	}
	if err := cp.expect(lineReady); err != nil {
		return res, err
	}

	runtime.GC()
	debug.FreeOSMemory()
	if !resetPeakRSS() {
		e.log.Warn("bench: cannot reset VmHWM; peak memory is the process's peak so far")
	}
	cpu0, srv0, sched0, host0 := cpuTime(), serverCPU("postgres", "redis-server"), schedSample(), readHostTimes()
	if err := cp.say(lineGo); err != nil {
		return res, err
	}
	if err := cp.expect(lineDone); err != nil {
		return res, err
	}
	res.CPU = cpuTime() - cpu0
	res.ServerCPU = serverCPU("postgres", "redis-server") - srv0
	res.PeakRSSKB = procStatusKB("VmHWM")
	res.Sched = schedLatencies(sched0, schedSample())
	res.Host = hostShares(host0, readHostTimes())

	var cr ClientResult
	if err := cp.result(&cr); err != nil {
		return res, err
	}
	res.Acked, res.Window, res.Capped, res.Errors = cr.Acked, cr.Window, cr.Capped, cr.Errors
	res.Latency, res.AckLatency, res.Delivered, res.Missing, res.Reconnects = cr.Latency, cr.AckLatency, cr.Delivered, cr.Missing, cr.Reconnects
	res.ClientCPU, res.SSEErr = cr.CPU, cr.SSEErr
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
