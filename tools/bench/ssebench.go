package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/taskrunner/taskrunner/services/task"
)

// bench-sse (issue 17) measures the SSE fan-out of the gateway against a
// reference hub, Mercure, in the same run, with the same payloads and the
// same clients. As in bench-events, this process serves (taskrunner's
// Events and Task services and the gateway's SSE handler on the Env, or an
// embedded Mercure hub) and a child process per scenario plays the
// publishers and the subscribers, so each side's CPU is measured apart.
//
// taskrunner's events are published the way the product publishes them: a
// runner (runner/eventsclient, mTLS) sends each event to the Events
// service, which commits it to PostgreSQL, acknowledges it and publishes
// eventwire.EncodeMessage to the task's Redis channel, where the gateway's hub
// picks it up. Mercure's publisher POSTs the same event JSON
// (eventwire.EncodeEvent: seq, time, payload) with the SSE id and event type
// taskrunner would send; Mercure's Bolt transport persists it before the
// fan-out. A publisher's acknowledgement is thus, on both sides, "stored
// durably and handed to the fan-out".

// Hub names.
const (
	HubTaskrunner = "taskrunner"
	HubMercure    = "mercure"
)

// SSE scenario kinds.
const (
	KindFanout = "fanout" // publishers send, every subscriber must get every event of its task
	KindIdle   = "idle"   // subscribers connect (a connect storm) and stay idle
)

// SSEScenario is one measured run against one hub.
type SSEScenario struct {
	Name string `json:"name"`
	Hub  string `json:"hub"`
	Kind string `json:"kind"`
	// Tasks and Subs: Subs subscribers on each of Tasks tasks.
	Tasks int `json:"tasks"`
	Subs  int `json:"subs"`
	// Events per task (fanout). Each task has one publisher.
	Events int `json:"events"`
	// Rate paces each task's publisher at this many events/s; 0 publishes
	// sequentially, each event as soon as the previous one is acknowledged.
	Rate float64 `json:"rate"`
	// Drain bounds the wait, after the last publish, for every subscriber
	// to have every event.
	Drain time.Duration `json:"drain"`
	// Concurrency bounds the connects in flight (subscribers that have not
	// yet received their stream's first line).
	Concurrency int `json:"concurrency"`
	// Settle is how long idle connections stay open before the server's
	// RSS is read.
	Settle time.Duration `json:"settle"`
}

// Connections is the number of SSE connections of the scenario.
func (s SSEScenario) Connections() int { return s.Tasks * s.Subs }

// SSETask is one task as the client process needs it.
type SSETask struct {
	URL     string `json:"url"`   // the subscribers' GET
	Token   string `json:"token"` // the subscribers' bearer token
	ID      string `json:"id"`
	Topic   string `json:"topic,omitempty"` // Mercure
	CertPEM []byte `json:"cert_pem,omitempty"`
	KeyPEM  []byte `json:"key_pem,omitempty"`
}

// SSESpec is everything the client process needs for one scenario.
type SSESpec struct {
	Scenario SSEScenario `json:"scenario"`
	Tasks    []SSETask   `json:"tasks"`
	// taskrunner's publisher: the Events service (mTLS gRPC).
	EventsAddr string `json:"events_addr,omitempty"`
	CAPEM      []byte `json:"ca_pem,omitempty"`
	// Mercure's publisher.
	PublishURL   string `json:"publish_url,omitempty"`
	PublishToken string `json:"publish_token,omitempty"`
}

// SSEClientResult is what the client process measured.
type SSEClientResult struct {
	Published     int64         `json:"published"` // acknowledged publishes
	PublishErrors int64         `json:"publish_errors"`
	PublishWindow time.Duration `json:"publish_window"` // go → last acknowledgement
	Ack           Latencies     `json:"ack"`            // publish → acknowledgement
	Window        time.Duration `json:"window"`         // go → last delivery (fanout) or last connect (idle)
	Delivered     int64         `json:"delivered"`      // events received, all subscribers
	Expected      int64         `json:"expected"`       // events × subscribers
	Duplicates    int64         `json:"duplicates"`     // an id at or below one already received
	Lost          int64         `json:"lost"`           // skipped ids plus ids never received
	Reconnects    int64         `json:"reconnects"`
	ConnectFailed int64         `json:"connect_failed"` // subscribers never connected
	Latency       Latencies     `json:"latency"`        // publish → receive, every copy
	FirstCopy     Latencies     `json:"first_copy"`     // publish → the first subscriber's receipt, per event
	LastCopy      Latencies     `json:"last_copy"`      // publish → the last subscriber's receipt, per event
	Connect       Latencies     `json:"connect"`        // dial → the stream's first line (idle)
	FirstErr      string        `json:"first_err,omitempty"`
	CPU           time.Duration `json:"cpu"` // the client process, go → done
}

// SSEResult is a scenario's measurements from both processes.
type SSEResult struct {
	SSEScenario
	SSEClientResult
	ServerCPU    time.Duration // the server process, go → done
	PGRedisCPU   time.Duration // local postgres and redis-server, same window (approximate)
	RSSBeforeKB  int64         // VmRSS of the server process before the connects (idle; after GC)
	RSSAfterKB   int64         // … with every connection open (after GC)
	OpenAtServer int64         // streams the taskrunner gateway counted open (idle)
	Rounds       RoundStats    // taskrunner: its task writers' rounds over their parked streams
}

// DeliveriesPerSec is events received by all subscribers per second of
// the window.
func (r SSEResult) DeliveriesPerSec() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Delivered) / r.Window.Seconds()
}

// RSSPerConnKiB is the server's RSS growth per open connection.
func (r SSEResult) RSSPerConnKiB() float64 {
	if r.Connections() == 0 {
		return 0
	}
	return float64(r.RSSAfterKB-r.RSSBeforeKB) / float64(r.Connections())
}

// TotalServerCPU is the server process plus, for taskrunner, PostgreSQL and
// Redis (the connects' GetTask and the events' commits run there; Mercure
// uses neither, so its pg+redis figure is other work on the host).
func (r SSEResult) TotalServerCPU() time.Duration {
	if r.Hub == HubTaskrunner {
		return r.ServerCPU + r.PGRedisCPU
	}
	return r.ServerCPU
}

// Complete reports whether every subscriber got every event exactly once
// and every connection was made.
func (r SSEResult) Complete() bool {
	return r.Duplicates == 0 && r.Lost == 0 && r.ConnectFailed == 0 && r.PublishErrors == 0 &&
		(r.Kind != KindFanout || r.Delivered == r.Expected)
}

// SSEEnv runs SSE scenarios: taskrunner on an Env, Mercure embedded.
type SSEEnv struct {
	*Env
	log       *slog.Logger
	clientCmd []string
	idleTasks []string // created once, reused by every idle scenario
}

// NewSSEEnv starts taskrunner's servers (see NewEnv). clientCmd starts the
// client process of each scenario: a program that calls RunSSEClient.
func NewSSEEnv(ctx context.Context, log *slog.Logger, clientCmd []string) (*SSEEnv, error) {
	env, err := NewEnv(ctx, EnvOptions{BaselineConns: 4, Logger: log, ClientCommand: clientCmd})
	if err != nil {
		return nil, err
	}
	return &SSEEnv{Env: env, log: log, clientCmd: clientCmd}, nil
}

// RaiseFileLimit lifts RLIMIT_NOFILE's soft limit to want (or to the hard
// limit, raising that too when the process may): 10,000 connections need
// 10,000 descriptors on each side. It returns the soft limit now in force.
func RaiseFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	if lim.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			return want, nil
		}
		want = lim.Max // not privileged: as far as the hard limit goes
	}
	lim.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	return want, nil
}

// tasksFor prepares the scenario's tasks on its hub, and the Mercure hub
// when it is the one measured (the caller closes it).
func (e *SSEEnv) tasksFor(ctx context.Context, sc SSEScenario) (SSESpec, *mercureHub, error) {
	spec := SSESpec{Scenario: sc}
	switch sc.Hub {
	case HubTaskrunner:
		var ids []string
		var err error
		if sc.Kind == KindFanout {
			ids, err = e.runningTasks(ctx, sc.Tasks) // stage changes need a running task
		} else {
			ids, err = e.idleTaskIDs(ctx, sc.Tasks)
		}
		if err != nil {
			return spec, nil, err
		}
		spec.EventsAddr, spec.CAPEM = e.GRPCAddr, e.CA.CertPEM()
		for _, id := range ids {
			t := SSETask{ID: id, URL: e.SSEURL + "/v1/tasks/" + id + "/events", Token: e.Token}
			if sc.Kind == KindFanout {
				if t.CertPEM, t.KeyPEM, err = e.CA.MintTaskCert(id, time.Now().Add(time.Hour)); err != nil {
					return spec, nil, err
				}
			}
			spec.Tasks = append(spec.Tasks, t)
		}
		return spec, nil, nil
	case HubMercure:
		m, err := startMercure(e.log)
		if err != nil {
			return spec, nil, err
		}
		if spec.PublishToken, err = m.token([]string{"*"}, nil); err != nil {
			_ = m.close()
			return spec, nil, err
		}
		spec.PublishURL = m.URL
		for range sc.Tasks {
			id := randomHex(16)
			topic := mercureTopic + id
			tok, err := m.token(nil, []string{topic})
			if err != nil {
				_ = m.close()
				return spec, nil, err
			}
			spec.Tasks = append(spec.Tasks, SSETask{ID: id, Topic: topic, Token: tok, URL: m.URL + "?topic=" + queryEscape(topic)})
		}
		return spec, m, nil
	}
	return spec, nil, fmt.Errorf("bench: unknown hub %q", sc.Hub)
}

// idleTaskIDs returns n tasks of benchOwner (created once, proposing: their
// streams stay open), reused by every idle scenario.
func (e *SSEEnv) idleTaskIDs(ctx context.Context, n int) ([]string, error) {
	for len(e.idleTasks) < n {
		tk, _, err := e.tasks.Create(ctx, task.NewTask{Owner: benchOwner, Repo: "acme/widgets", BaseBranch: "main",
			Prompt: "watch the event stream", Agent: task.AgentClaude}, "")
		if err != nil {
			return nil, err
		}
		e.idleTasks = append(e.idleTasks, tk.ID)
	}
	return e.idleTasks[:n], nil
}

// RunSSE performs one scenario: this process serves, a child process plays
// the publishers and subscribers (the protocol of RunSSEClient).
func (e *SSEEnv) RunSSE(ctx context.Context, sc SSEScenario) (res SSEResult, err error) {
	res.SSEScenario = sc
	if len(e.clientCmd) == 0 {
		return res, errors.New("bench: no client command to run the clients with")
	}
	spec, m, err := e.tasksFor(ctx, sc)
	if err != nil {
		return res, err
	}
	if m != nil {
		defer func() {
			if cerr := m.close(); cerr != nil && err == nil {
				err = fmt.Errorf("bench: stopping mercure: %w", cerr)
			}
		}()
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
	say, expect := cp.say, cp.expect
	if err := say(string(specJSON)); err != nil {
		return res, err
	}
	if err := expect(lineReady); err != nil {
		return res, err
	}
	settle()
	res.RSSBeforeKB = procStatusKB("VmRSS")
	cpu0, srv0, rounds0 := cpuTime(), serverCPU("postgres", "redis-server"), e.rounds.snapshot()
	if err := say(lineGo); err != nil {
		return res, err
	}
	if err := expect(lineDone); err != nil {
		return res, err
	}
	res.ServerCPU = cpuTime() - cpu0
	res.PGRedisCPU = serverCPU("postgres", "redis-server") - srv0
	if sc.Hub == HubTaskrunner {
		res.Rounds = e.rounds.snapshot().since(rounds0)
	}
	if sc.Kind == KindIdle {
		if err := sleepCtx(ctx, sc.Settle); err != nil {
			return res, err
		}
		settle()
		res.RSSAfterKB = procStatusKB("VmRSS")
		if sc.Hub == HubTaskrunner {
			res.OpenAtServer = e.sseSubscribers()
		}
	}
	if err := say(lineEnd); err != nil {
		return res, err
	}
	if err := cp.result(&res.SSEClientResult); err != nil {
		return res, err
	}
	return res, nil
}

// lineEnd: the parent has measured; the client closes everything and
// answers with its result.
const lineEnd = "end"

// settle collects garbage and returns freed memory to the OS, so an RSS
// reading counts what is live.
func settle() {
	runtime.GC()
	debug.FreeOSMemory()
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sseSubscribers is the gateway's count of open SSE streams.
func (e *Env) sseSubscribers() int64 { return e.sse.Subscribers() }

func queryEscape(s string) string { return url.QueryEscape(s) }
