package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/taskrunner/taskrunner/platform/eventwire"
	taskrunnerv1 "github.com/taskrunner/taskrunner/proto/gen/taskrunner/v1"
	"github.com/taskrunner/taskrunner/runner/eventsclient"
)

// RunSSEClient is bench-sse's client process. The parent and the child
// talk over the child's stdin and stdout, one line each:
//
//	parent → child  SSESpec as JSON
//	child → parent  "ready"   fanout: every subscriber and publisher is connected; idle: nothing is
//	parent → child  "go"      publish (fanout) or connect every subscriber (idle: the connect storm)
//	child → parent  "done"    fanout: published and drained; idle: every subscriber connected
//	parent → child  "end"     the parent has read its figures (idle: the RSS with every connection open)
//	child → parent  SSEClientResult as JSON, after closing everything
func RunSSEClient(ctx context.Context, in io.Reader, out io.Writer, log *slog.Logger) error {
	rd := bufio.NewReader(in)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("bench client: reading the spec: %w", err)
	}
	var spec SSESpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("bench client: bad spec: %w", err)
	}
	if _, err := RaiseFileLimit(uint64(spec.Scenario.Connections()) + 1024); err != nil {
		return fmt.Errorf("bench client: raising the open-file limit: %w", err)
	}
	wait := func(want string) error {
		got, err := rd.ReadString('\n')
		if err != nil || strings.TrimSpace(got) != want {
			return fmt.Errorf("bench client: expected %q from the parent, got %q (%v)", want, got, err)
		}
		return nil
	}
	say := func(s string) error { _, err := fmt.Fprintln(out, s); return err }
	c := &sseRun{spec: spec, sc: spec.Scenario, log: log}
	var res SSEClientResult
	switch spec.Scenario.Kind {
	case KindFanout:
		res, err = c.fanout(ctx, say, wait)
	case KindIdle:
		res, err = c.idle(ctx, say, wait)
	default:
		err = fmt.Errorf("bench client: unknown scenario kind %q", spec.Scenario.Kind)
	}
	if err != nil {
		return err
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return say(string(b))
}

type sseRun struct {
	spec SSESpec
	sc   SSEScenario
	log  *slog.Logger
	subs []*subscriber
	swg  sync.WaitGroup
}

// sseHTTP is the subscribers' client: one connection per stream.
func sseHTTP(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns + 1, MaxIdleConns: conns + 1, DisableCompression: true,
		ResponseHeaderTimeout: time.Minute}}
}

// startSubs starts every subscriber (Subs per task) under ctx, at most
// sc.Concurrency connecting at once, and returns when each has connected
// once or within timeout.
func (c *sseRun) startSubs(ctx context.Context, timeout time.Duration) error {
	n := c.sc.Connections()
	hc := sseHTTP(n)
	sem := make(chan struct{}, max(c.sc.Concurrency, 1))
	var connected sync.WaitGroup
	c.subs = make([]*subscriber, 0, n)
	for i := range n {
		t := c.spec.Tasks[i%len(c.spec.Tasks)]
		s := &subscriber{client: hc, url: t.URL, token: t.Token, want: int64(c.sc.Events)}
		c.subs = append(c.subs, s)
		connected.Add(1)
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.swg.Go(func() {
			s.run(ctx, func() { <-sem; connected.Done() })
		})
	}
	return waitGroupTimeout(&connected, timeout)
}

// stopSubs closes every stream and folds the subscribers' counts into res.
func (c *sseRun) stopSubs(cancel context.CancelFunc, res *SSEClientResult) {
	cancel()
	c.swg.Wait()
	var lat, conn []time.Duration
	for _, s := range c.subs {
		lat = append(lat, s.lat...)
		if s.connectedIn > 0 {
			conn = append(conn, s.connectedIn)
		} else {
			res.ConnectFailed++
		}
		res.Delivered += s.delivered
		res.Duplicates += s.dups
		res.Lost += s.gaps + max(s.want-s.last.Load(), 0)
		res.Reconnects += s.reconnects
		if res.FirstErr == "" && s.firstErr != nil {
			res.FirstErr = s.firstErr.Error()
		}
	}
	res.Expected = int64(len(c.subs)) * int64(c.sc.Events)
	res.FirstCopy, res.LastCopy = c.copies()
	res.Latency, res.Connect = Summarise(lat), Summarise(conn)
}

// copies is, for every event of every task, its first and its last
// subscriber's publish → receive: the first is the way to the hub and
// through it, the spread between them the fan-out. Only subscribers that
// received every event in order count (their i-th latency is event i's).
func (c *sseRun) copies() (first, last Latencies) {
	if len(c.spec.Tasks) == 0 {
		return
	}
	var firsts, lasts []time.Duration
	for t := range c.spec.Tasks {
		for i := range c.sc.Events {
			lo, hi := time.Duration(-1), time.Duration(-1)
			for j := t; j < len(c.subs); j += len(c.spec.Tasks) {
				s := c.subs[j]
				if s.gaps > 0 || len(s.lat) != int(s.want) {
					continue
				}
				d := s.lat[i]
				if lo < 0 || d < lo {
					lo = d
				}
				hi = max(hi, d)
			}
			if lo >= 0 {
				firsts, lasts = append(firsts, lo), append(lasts, hi)
			}
		}
	}
	return Summarise(firsts), Summarise(lasts)
}

func (c *sseRun) idle(ctx context.Context, say func(string) error, wait func(string) error) (SSEClientResult, error) {
	var res SSEClientResult
	if err := say(lineReady); err != nil {
		return res, err
	}
	if err := wait(lineGo); err != nil {
		return res, err
	}
	cpu0, start := cpuTime(), time.Now()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err := c.startSubs(sctx, 2*time.Minute)
	res.Window = time.Since(start)
	res.CPU = cpuTime() - cpu0
	if err != nil {
		c.log.Warn("bench client: not every subscriber connected", "error", err)
	}
	if err := say(lineDone); err != nil {
		return res, err
	}
	if err := wait(lineEnd); err != nil {
		return res, err
	}
	c.stopSubs(cancel, &res)
	return res, nil
}

func (c *sseRun) fanout(ctx context.Context, say func(string) error, wait func(string) error) (SSEClientResult, error) {
	var res SSEClientResult
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := c.startSubs(sctx, 2*time.Minute); err != nil {
		c.stopSubs(cancel, &res)
		return res, fmt.Errorf("subscribers did not connect: %w (first error: %s)", err, res.FirstErr)
	}
	pubs, closePubs, err := c.publishers(ctx)
	defer closePubs()
	if err != nil {
		c.stopSubs(cancel, &res)
		return res, err
	}
	if err := say(lineReady); err != nil {
		return res, err
	}
	if err := wait(lineGo); err != nil {
		return res, err
	}
	cpu0, start := cpuTime(), time.Now()

	// One publisher per task, all at once.
	var pwg sync.WaitGroup
	acks := make([][]time.Duration, len(pubs))
	var published, failed atomic.Int64
	var lastAck atomic.Int64
	for ti, p := range pubs {
		pwg.Go(func() {
			interval := time.Duration(0)
			if c.sc.Rate > 0 {
				interval = time.Duration(float64(time.Second) / c.sc.Rate)
			}
			for i := range c.sc.Events {
				if interval > 0 && sleepUntil(ctx, start.Add(time.Duration(i)*interval)) != nil {
					return
				}
				ev := workloadEvent(ti, i, c.sc.Events, 0)
				ev.Seq = int64(i + 1)
				t0 := time.Now()
				ev.Time = timestamppb.New(t0)
				if err := p.publish(ctx, ev, interval == 0); err != nil {
					if failed.Add(1) == 1 {
						c.log.Warn("bench client: publish failed", "error", err)
					}
					return
				}
				now := time.Now()
				if interval == 0 {
					acks[ti] = append(acks[ti], now.Sub(t0))
				}
				published.Add(1)
				lastAck.Store(now.UnixNano())
			}
			// A paced taskrunner publisher does not wait for each ack: wait
			// for the last one here.
			if err := p.settle(ctx, int64(c.sc.Events), c.sc.Drain); err != nil {
				failed.Add(1)
				c.log.Warn("bench client: publisher did not settle", "error", err)
			} else {
				lastAck.Store(time.Now().UnixNano())
			}
		})
	}
	pwg.Wait()
	res.Published, res.PublishErrors = published.Load(), failed.Load()
	res.PublishWindow = time.Duration(lastAck.Load() - start.UnixNano())
	var all []time.Duration
	for _, a := range acks {
		all = append(all, a...)
	}
	res.Ack = Summarise(all)

	// Drain: every subscriber should have every event of its task.
	drainBy := time.Now().Add(c.sc.Drain)
	for time.Now().Before(drainBy) && ctx.Err() == nil {
		if c.drained() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	var lastAt int64
	for _, s := range c.subs {
		lastAt = max(lastAt, s.lastAt.Load())
	}
	res.Window = time.Duration(lastAt - start.UnixNano())
	if !c.drained() || lastAt == 0 {
		res.Window = time.Since(start)
	}
	res.CPU = cpuTime() - cpu0
	if err := say(lineDone); err != nil {
		return res, err
	}
	if err := wait(lineEnd); err != nil {
		return res, err
	}
	c.stopSubs(cancel, &res)
	return res, nil
}

func (c *sseRun) drained() bool {
	for _, s := range c.subs {
		if s.last.Load() < s.want {
			return false
		}
	}
	return true
}

type eventT = taskrunnerv1.Event

// publisher sends one task's events to its hub.
type publisher interface {
	// publish sends ev (its Seq and Time are set); with wait it returns
	// once the hub acknowledged it.
	publish(ctx context.Context, ev *eventT, wait bool) error
	// settle waits until the first n events are acknowledged.
	settle(ctx context.Context, n int64, timeout time.Duration) error
}

// publishers connects one publisher per task.
func (c *sseRun) publishers(ctx context.Context) ([]publisher, func(), error) {
	var pubs []publisher
	switch c.sc.Hub {
	case HubTaskrunner:
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(c.spec.CAPEM) {
			return nil, func() {}, errors.New("bench client: the spec's CA is not PEM")
		}
		var ecs []*eventsclient.Client
		closeAll := func() { closeClients(ecs) }
		for _, t := range c.spec.Tasks {
			cert, err := tls.X509KeyPair(t.CertPEM, t.KeyPEM)
			if err != nil {
				return nil, closeAll, err
			}
			ec, err := eventsclient.New(eventsclient.Config{Addr: "passthrough:///" + c.spec.EventsAddr, TaskID: t.ID, RunnerVersion: "bench",
				TLS:    &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: "127.0.0.1", Certificates: []tls.Certificate{cert}},
				Logger: c.log, BufferSize: c.sc.Events + 16, MinBackoff: 20 * time.Millisecond, MaxBackoff: time.Second})
			if err != nil {
				return nil, closeAll, err
			}
			ecs = append(ecs, ec)
			ec.Start(ctx)
			pubs = append(pubs, runnerPublisher{ec})
		}
		for _, ec := range ecs {
			select {
			case <-ec.Connected():
			case <-ec.Done():
				return nil, closeAll, fmt.Errorf("a runner's stream ended before it was welcomed: %v", ec.Err())
			case <-time.After(60 * time.Second):
				return nil, closeAll, errors.New("the runners were not welcomed within 60s")
			}
		}
		return pubs, closeAll, nil
	case HubMercure:
		tr := &http.Transport{MaxIdleConnsPerHost: len(c.spec.Tasks) + 1, MaxIdleConns: len(c.spec.Tasks) + 1}
		hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		for _, t := range c.spec.Tasks {
			pubs = append(pubs, &mercurePublisher{http: hc, url: c.spec.PublishURL, token: c.spec.PublishToken, topic: t.Topic, taskID: t.ID})
		}
		return pubs, tr.CloseIdleConnections, nil
	}
	return nil, func() {}, fmt.Errorf("bench client: unknown hub %q", c.sc.Hub)
}

// runnerPublisher is a real runner: eventsclient on its own mTLS stream.
type runnerPublisher struct{ ec *eventsclient.Client }

func (p runnerPublisher) publish(ctx context.Context, ev *eventT, wait bool) error {
	seq, err := p.ec.Send(ev)
	if err != nil {
		return err
	}
	if seq != ev.GetSeq() {
		return fmt.Errorf("eventsclient numbered the event %d, not %d", seq, ev.GetSeq())
	}
	if !wait {
		return nil
	}
	return p.settle(ctx, seq, 30*time.Second)
}

// settle waits for the Events service's acknowledgement of seq n
// (eventsclient wakes the waiter on each Ack, as Mercure's publisher is
// woken by its POST's answer).
func (p runnerPublisher) settle(ctx context.Context, n int64, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := p.ec.WaitAcked(ctx, n); err != nil {
		return fmt.Errorf("seq %d not acknowledged within %s (acked %d): %w", n, timeout, p.ec.Acked(), err)
	}
	return nil
}

// mercurePublisher POSTs each event as a private update with the SSE id
// and event type taskrunner would send. Ids carry the task because Mercure
// looks a Last-Event-ID up in one history shared by every topic.
type mercurePublisher struct {
	http                      *http.Client
	url, token, topic, taskID string
}

func (p *mercurePublisher) publish(ctx context.Context, ev *eventT, _ bool) error {
	data, err := eventwire.EncodeEvent(ev)
	if err != nil {
		return err
	}
	form := url.Values{"topic": {p.topic}, "data": {string(data)}, "id": {mercureID(ev.GetSeq(), p.taskID)},
		"type": {eventwire.TypeName(ev)}, "private": {"on"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, strings.NewReader(form.Encode()))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+p.token)
	resp, err := p.http.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("mercure publish: %s", resp.Status)
	}
	return nil
}

// settle: a Mercure publish is acknowledged by its answer.
func (p *mercurePublisher) settle(context.Context, int64, time.Duration) error { return nil }

func mercureID(seq int64, taskID string) string { return strconv.FormatInt(seq, 10) + "@" + taskID }

// subscriber is one browser watching a task over SSE on either hub. It
// counts every event it receives by sequence number (the id's number,
// before any "@"), records publish → receive latency from the event's
// "time", and when the stream breaks reconnects with Last-Event-ID (the id
// exactly as received), as EventSource does. Only its own goroutine writes
// its fields; the atomics are read while it runs.
type subscriber struct {
	client     *http.Client
	url, token string
	want       int64 // events its task will publish

	last   atomic.Int64 // runner events received in order (the taskrunner timeline's control-plane events not counted)
	raw    int64        // highest seq (SSE id) received
	cp     int64        // control-plane events received (status_change, queue_position, sandbox)
	lastAt atomic.Int64 // unix nanos of the receipt of seq want
	lastID string

	connectedIn      time.Duration // dial → first line of the first stream
	delivered, dups  int64
	gaps, reconnects int64
	lat              []time.Duration
	firstErr         error
}

func (s *subscriber) run(ctx context.Context, connected func()) {
	once := sync.OnceFunc(connected)
	defer once() // a subscriber that never connected must not hold its waiter
	start := time.Now()
	for ctx.Err() == nil {
		err := s.stream(ctx, func() {
			if s.connectedIn == 0 {
				s.connectedIn = max(time.Since(start), 1)
			}
			once()
		})
		if ctx.Err() != nil {
			return
		}
		if s.firstErr == nil {
			s.firstErr = err
		}
		s.reconnects++
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *subscriber) stream(ctx context.Context, connected func()) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Accept", "text/event-stream")
	if s.lastID != "" {
		req.Header.Set("Last-Event-ID", s.lastID)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sse: %s", resp.Status)
	}
	rd := bufio.NewReaderSize(resp.Body, 8<<10)
	var id, typ []byte
	var sent time.Time
	first := true
	for {
		line, err := rd.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				return errors.New("sse: line longer than 8 KiB")
			}
			return fmt.Errorf("sse: stream ended: %w", err)
		}
		if first {
			first = false
			connected() // taskrunner's "retry:" or Mercure's ":" after the subscription
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0: // end of a message
			if id != nil {
				s.received(string(id), string(typ), sent)
			}
			id, typ, sent = nil, typ[:0], time.Time{}
		case bytes.HasPrefix(line, []byte("event:")):
			typ = append(typ[:0], bytes.TrimSpace(line[6:])...)
		case bytes.HasPrefix(line, []byte("id:")):
			id = append(id[:0], bytes.TrimSpace(line[3:])...)
		case bytes.HasPrefix(line, []byte("data:")):
			sent, _ = EventTime(line[5:])
		}
	}
}

// controlPlane are the taskrunner timeline's events that no publisher of
// the benchmark sends (the task's status changes, queue and sandbox): they
// keep the SSE ids gap-free but are not counted as deliveries.
var controlPlane = map[string]bool{"status_change": true, "queue_position": true, "sandbox": true}

func (s *subscriber) received(id, typ string, sent time.Time) {
	now := time.Now()
	num, _, _ := strings.Cut(id, "@")
	seq, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		if s.firstErr == nil {
			s.firstErr = fmt.Errorf("sse: id %q is not a sequence number", id)
		}
		return
	}
	switch {
	case seq <= s.raw:
		s.dups++
		return
	case seq > s.raw+1:
		s.gaps += seq - s.raw - 1
	}
	s.raw = seq
	if controlPlane[typ] {
		s.cp++
		s.lastID = id
		return
	}
	seq -= s.cp // the runner event's number among the published ones
	s.delivered++
	if !sent.IsZero() {
		s.lat = append(s.lat, now.Sub(sent))
	}
	s.lastID = id
	if seq >= s.want {
		s.lastAt.Store(now.UnixNano())
	}
	s.last.Store(seq)
}
