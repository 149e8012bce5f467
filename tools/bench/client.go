package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

// The clients of a scenario (runners, SSE watchers, the delay proxy) run in
// a child process of their own, as they do in production (runners in
// sandboxes, browsers elsewhere): the servers' goroutines do not queue
// behind hundreds of client goroutines in one Go scheduler, and each side's
// CPU is measured on its own. The parent and the child talk over the
// child's stdin and stdout, one line each:
//
//	parent → child  ClientSpec as JSON
//	child → parent  "ready"             every client is connected
//	parent → child  "go"                start sending
//	child → parent  "done"              sent, acknowledged and drained
//	child → parent  ClientResult as JSON
const (
	lineReady = "ready"
	lineGo    = "go"
	lineDone  = "done"
)

// ClientTask is one runner's identity.
type ClientTask struct {
	ID      string `json:"id"`
	CertPEM []byte `json:"cert_pem,omitempty"` // the task's client certificate (new design)
	KeyPEM  []byte `json:"key_pem,omitempty"`
	Secret  []byte `json:"secret,omitempty"` // the task's callback secret (baseline)
}

// ClientSpec is everything the client process needs for one scenario.
type ClientSpec struct {
	Scenario Scenario     `json:"scenario"`
	Target   string       `json:"target"` // the runners' server: mTLS gRPC (new) or HTTPS (baseline)
	CAPEM    []byte       `json:"ca_pem"` // verifies both servers
	SSEURL   string       `json:"sse_url"`
	Token    string       `json:"token"` // bearer token of the tasks' owner
	Tasks    []ClientTask `json:"tasks"`
}

// ClientResult is what the client process measured.
type ClientResult struct {
	Acked      int64         `json:"acked"`
	Window     time.Duration `json:"window"`
	Capped     bool          `json:"capped"`
	Errors     int64         `json:"errors"`
	Latency    Latencies     `json:"latency"`
	AckLatency Latencies     `json:"ack_latency"`
	Delivered  int64         `json:"delivered"`
	Missing    int64         `json:"missing"`
	Reconnects int64         `json:"reconnects"`
	SSEErr     string        `json:"sse_err,omitempty"`
	CPU        time.Duration `json:"cpu"` // the client process, "go" to "done"
}

// RunClient is the client process: it reads a ClientSpec from in, connects
// the SSE watchers and (new design) the runners, says ready, waits for go,
// runs the scenario and writes its ClientResult to out.
func RunClient(ctx context.Context, in io.Reader, out io.Writer, log *slog.Logger) error {
	rd := bufio.NewReader(in)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench client: reading the spec: %w", err)
	}
	var spec ClientSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("bench client: bad spec: %w", err)
	}
	c := &client{spec: spec, sc: spec.Scenario, log: log, roots: x509.NewCertPool()}
	if !c.roots.AppendCertsFromPEM(spec.CAPEM) {
		return errors.New("bench client: the spec's CA is not PEM")
	}
	res, err := c.run(ctx, func() error {
		if _, err := fmt.Fprintln(out, lineReady); err != nil {
			return err
		}
		got, err := rd.ReadString('\n')
		if err != nil || got != lineGo+"\n" {
			return fmt.Errorf("bench client: expected %q from the parent, got %q (%v)", lineGo, got, err)
		}
		return nil
	}, func() { _, _ = fmt.Fprintln(out, lineDone) })
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

type client struct {
	spec  ClientSpec
	sc    Scenario
	log   *slog.Logger
	roots *x509.CertPool
}

func (c *client) serverTLS() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: c.roots, ServerName: "127.0.0.1"}
}

// run connects everything, calls ready (which returns once the parent says
// go), runs the scenario, calls done once the SSE clients drained, and
// returns the measurements.
func (c *client) run(ctx context.Context, ready func() error, done func()) (ClientResult, error) {
	var res ClientResult
	sc := c.sc
	target := c.spec.Target
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
	var connected, wwg sync.WaitGroup
	for i := range watchers {
		watched[i] = i % sc.Runners
		w := &watcher{client: sseClient, url: c.spec.SSEURL + "/v1/tasks/" + c.spec.Tasks[watched[i]].ID + "/events", token: c.spec.Token}
		watchers[i] = w
		connected.Add(1)
		wwg.Go(func() { w.run(wctx, connected.Done) })
	}
	if err := waitGroupTimeout(&connected, 60*time.Second); err != nil {
		stopWatchers()
		wwg.Wait()
		return res, fmt.Errorf("SSE clients did not connect: %w", err)
	}
	defer func() { stopWatchers(); wwg.Wait() }()

	// The new design's runners connect (TLS handshake, Hello, Welcome)
	// before the clock starts, as a real runner does long before its agent
	// produces events; the baseline's connections are opened by its first
	// requests, which its long runs make negligible.
	var runners []*eventsclient.Client
	if sc.Design == DesignNew {
		var err error
		runners, err = c.connectNew(ctx, target)
		defer closeClients(runners)
		if err != nil {
			return res, err
		}
	}

	if err := ready(); err != nil {
		return res, err
	}
	cpu0 := cpuTime()
	start := time.Now()
	deadline := start.Add(sc.Cap)

	var lastSeq []func() int64 // per runner: highest acknowledged seq
	var end time.Time
	var err error
	switch sc.Design {
	case DesignNew:
		lastSeq, end, err = c.runNew(ctx, runners, start, deadline, &res)
	case DesignBaseline:
		lastSeq, end, err = c.runBaseline(ctx, target, start, deadline, &res)
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
	done()
	res.CPU = cpuTime() - cpu0
	stopWatchers()
	wwg.Wait()

	var lat []time.Duration
	for i, w := range watchers {
		w.mu.Lock()
		lat = append(lat, w.lat...)
		if res.SSEErr == "" && len(w.errs) > 0 {
			res.SSEErr = w.errs[0].Error()
		}
		w.mu.Unlock()
		res.Delivered += int64(len(w.lat))
		res.Reconnects += w.reconnects.Load()
		res.Missing += max(want[watched[i]]-w.last.Load(), 0)
	}
	res.Latency = Summarise(lat)
	return res, nil
}

// connectNew starts one eventsclient per task (each its own mTLS
// connection and task certificate) and waits until every one is welcomed.
func (c *client) connectNew(ctx context.Context, addr string) ([]*eventsclient.Client, error) {
	clients := make([]*eventsclient.Client, 0, len(c.spec.Tasks))
	for _, t := range c.spec.Tasks {
		cert, err := tls.X509KeyPair(t.CertPEM, t.KeyPEM)
		if err != nil {
			return clients, fmt.Errorf("task %s certificate: %w", t.ID, err)
		}
		tlsCfg := c.serverTLS()
		tlsCfg.Certificates = []tls.Certificate{cert}
		ec, err := eventsclient.New(eventsclient.Config{Addr: "passthrough:///" + addr, TLS: tlsCfg, TaskID: t.ID,
			RunnerVersion: "bench", Logger: c.log, BufferSize: c.sc.Events + 16,
			MinBackoff: 20 * time.Millisecond, MaxBackoff: time.Second})
		if err != nil {
			return clients, err
		}
		clients = append(clients, ec)
		ec.Start(ctx)
	}
	timeout := time.After(60 * time.Second)
	for _, ec := range clients {
		select {
		case <-ec.Connected():
		case <-ec.Done():
			return clients, fmt.Errorf("a runner's stream ended before it was welcomed: %v", ec.Err())
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

// runNew streams through the connected runners and returns when every sent
// event is acknowledged or at the deadline.
func (c *client) runNew(ctx context.Context, clients []*eventsclient.Client, start, deadline time.Time, res *ClientResult) ([]func() int64, time.Time, error) {
	sc := c.sc
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
	for r, ec := range clients {
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
				if _, err := ec.Send(ev); err != nil {
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
		for r, ec := range clients {
			a := min(ec.Acked(), int64(sc.Events))
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
		c.log.Warn("bench: a runner's Send failed", "error", v)
	}
	last := make([]func() int64, len(clients))
	for r, ec := range clients {
		last[r] = ec.Acked
	}
	return last, end, nil
}

// runBaseline posts every event and waits for each answer, sequentially
// per runner, until done or the deadline.
func (c *client) runBaseline(ctx context.Context, addr string, start, deadline time.Time, res *ClientResult) ([]func() int64, time.Time, error) {
	sc := c.sc
	tr := &http.Transport{
		TLSClientConfig:     c.serverTLS(),
		MaxIdleConnsPerHost: sc.Runners,
		MaxIdleConns:        sc.Runners,
		IdleConnTimeout:     time.Minute,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	at := pacer(sc, start)
	lastOK := make([]atomic.Int64, sc.Runners)
	var acked, failed atomic.Int64
	ackLat := make([][]time.Duration, sc.Runners)
	var wg sync.WaitGroup
	for r, t := range c.spec.Tasks {
		bc := &baselineClient{http: hc, url: "https://" + addr + baselinePath, taskID: t.ID, secret: t.Secret}
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
				if err := bc.post(ctx, ev); err != nil {
					if failed.Add(1) == 1 {
						c.log.Warn("bench: baseline post failed", "error", err)
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
	res.Capped = res.Acked < int64(sc.Runners)*int64(sc.Events) && !end.Before(deadline)
	last := make([]func() int64, sc.Runners)
	for r := range last {
		last[r] = lastOK[r].Load
	}
	return last, end, nil
}
