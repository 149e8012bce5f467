package faults

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gatewayOutage is how long taskrunnerd stays down in
// TestGatewayReconnectsAfterTaskrunnerdDown. Issue 19 saw 45 s; 15 s is
// already far past the point where the gateway's backoff reaches its cap
// (about 2 s), and keeps the suite short.
const gatewayOutage = 15 * time.Second

// probe is a series of requests to one gateway URL: when each answered and
// with what.
type probe struct {
	mu    sync.Mutex
	codes map[int]int
	first map[int]time.Time
}

func (p *probe) record(code int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.codes[code]++
	if _, ok := p.first[code]; !ok {
		p.first[code] = time.Now()
	}
}

func (p *probe) ok() (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	at, ok := p.first[http.StatusOK]
	return at, ok
}

func (p *probe) String() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var parts []string
	for c, n := range p.codes {
		parts = append(parts, fmt.Sprintf("%d×%d", n, c))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

// poll requests url every gap (the next one starts once the last answered)
// until stop closes.
func (s *stack) poll(url string, auth bool, gap time.Duration, stop <-chan struct{}) *probe {
	p := &probe{codes: map[int]int{}, first: map[int]time.Time{}}
	hc := &http.Client{Timeout: 5 * time.Second}
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			if auth {
				req.Header.Set("Authorization", "Bearer "+s.token)
			}
			code := 0 // no answer at all
			if resp, err := hc.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				code = resp.StatusCode
			}
			p.record(code)
			select {
			case <-stop:
				return
			case <-time.After(gap): // a client's pace, not a wait for a result
			}
		}
	}()
	return p
}

// taskrunnerd killed and down gatewayOutage, then back: the gateway (never
// restarted) serves REST and /readyz again within 1 s of taskrunnerd's
// public port listening. During the outage REST answers 503, /readyz 503.
func TestGatewayReconnectsAfterTaskrunnerdDown(t *testing.T) {
	s := newStack(t)
	gw := s.gateway()
	s.runningTask(time.Hour)
	require.Eventually(t, func() bool {
		r, _ := s.get(gw + "/v1/tasks")
		return r.StatusCode == http.StatusOK
	}, 20*time.Second, 20*time.Millisecond)

	s.kill()
	down := time.Now()
	// A load balancer's readiness probe and a client retrying REST, through
	// the whole outage and the restart.
	stop := make(chan struct{})
	defer close(stop)
	ready := s.poll(gw+"/readyz", false, 100*time.Millisecond, stop)
	rest := s.poll(gw+"/v1/tasks", true, 20*time.Millisecond, stop)
	<-time.After(time.Until(down.Add(gatewayOutage))) // the outage
	_, restOK := rest.ok()
	_, readyOK := ready.ok()
	require.False(t, restOK || readyOK, "nothing is served while taskrunnerd is down")
	outageREST, outageReady := rest.String(), ready.String()

	// When taskrunnerd's public port (the one the gateway dials) listens.
	listening := make(chan time.Time, 1)
	go func() {
		for {
			if c, err := net.DialTimeout("tcp", s.grpcAddr, 50*time.Millisecond); err == nil {
				listening <- time.Now()
				_ = c.Close()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	s.start()
	up := <-listening
	var restAt, readyAt time.Time
	require.Eventually(t, func() bool {
		var ok1, ok2 bool
		restAt, ok1 = rest.ok()
		readyAt, ok2 = ready.ok()
		return ok1 && ok2
	}, 60*time.Second, 5*time.Millisecond, "the gateway never served again: REST %s, /readyz %s", rest, ready)
	restAfter, readyAfter := restAt.Sub(up), readyAt.Sub(up)
	t.Logf("taskrunnerd down %s: during the outage REST %s, /readyz %s (status×count); back: REST 200 %.3f s, /readyz 200 %.3f s after taskrunnerd listened",
		gatewayOutage, outageREST, outageReady, restAfter.Seconds(), readyAfter.Seconds())
	require.LessOrEqual(t, restAfter, time.Second, "REST back within 1 s")
	require.LessOrEqual(t, readyAfter, time.Second, "/readyz back within 1 s")
	// The gateway was never restarted, and it is still serving.
	require.NoError(t, syscall.Kill(s.gatewayPID, 0))
	r, _ := s.get(gw + "/v1/tasks")
	require.Equal(t, http.StatusOK, r.StatusCode)
}

// gatewayLoad is what a leak would show in the gateway process: its open
// descriptors, threads and resident memory (/proc), and its /metrics
// gauges.
type gatewayLoad struct {
	fds, threads int
	rssKB        int64
	subscribers  int64
	channels     int64
}

func (g gatewayLoad) String() string {
	return fmt.Sprintf("fds %d, threads %d, RSS %.1f MB, sse subscribers %d, channels %d", g.fds, g.threads, float64(g.rssKB)/1024, g.subscribers, g.channels)
}

// metricValue is the value of the first sample of name on a Prometheus text
// page (-1 when absent).
func metricValue(page, name string) int64 {
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, name) || (len(l) > len(name) && l[len(name)] != ' ' && l[len(name)] != '{') {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			return int64(v)
		}
	}
	return -1
}

func (s *stack) gatewayLoad(gw string) gatewayLoad {
	s.t.Helper()
	var g gatewayLoad
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", s.gatewayPID))
	require.NoError(s.t, err)
	g.fds = len(ents)
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.gatewayPID))
	require.NoError(s.t, err)
	for _, l := range strings.Split(string(st), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "Threads:" {
			g.threads, _ = strconv.Atoi(f[1])
		}
		if len(f) >= 2 && f[0] == "VmRSS:" {
			g.rssKB, _ = strconv.ParseInt(f[1], 10, 64)
		}
	}
	// No keep-alive: the probe itself must not hold a gateway descriptor.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(gw + "/metrics")
	require.NoError(s.t, err)
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	g.subscribers = metricValue(string(b), "taskrunner_sse_subscribers")
	g.channels = metricValue(string(b), "taskrunner_sse_channels")
	return g
}

// raiseOpenFiles lifts this process's soft descriptor limit to at least n
// (children, the gateway included, inherit it).
func raiseOpenFiles(t testing.TB, n uint64) {
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Cur >= n {
		return
	}
	require.GreaterOrEqual(t, lim.Max, n, "the hard open-file limit is too low for this test")
	lim.Cur = n
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
}

// sseRound opens n SSE streams over tasks (each its own TCP connection),
// waits until every one has its first replayed frame and the gateway counts
// n subscribers, then closes them all. It returns the load at the peak.
func (s *stack) sseRound(gw string, ids []string, n int) gatewayLoad {
	s.t.Helper()
	tr := &http.Transport{DisableKeepAlives: true, MaxConnsPerHost: 0}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	bodies := make(chan io.Closer, n)
	sem := make(chan struct{}, 100) // at most 100 connecting at once
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gw+"/v1/tasks/"+ids[i%len(ids)]+"/events", nil)
			req.Header.Set("Authorization", "Bearer "+s.token)
			resp, err := hc.Do(req)
			if err != nil {
				errs <- err
				return
			}
			if resp.StatusCode != http.StatusOK {
				_ = resp.Body.Close()
				errs <- fmt.Errorf("stream %d: HTTP %d", i, resp.StatusCode)
				return
			}
			bodies <- resp.Body
			br := bufio.NewReader(resp.Body)
			for {
				l, err := br.ReadString('\n')
				if err != nil {
					errs <- fmt.Errorf("stream %d ended before its first event: %w", i, err)
					return
				}
				if strings.HasPrefix(l, "id:") {
					return // live: the replay's first event arrived
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(s.t, err)
	}
	var peak gatewayLoad
	require.Eventually(s.t, func() bool { peak = s.gatewayLoad(gw); return peak.subscribers == int64(n) },
		30*time.Second, 50*time.Millisecond, "the gateway never counted %d subscribers", n)
	close(bodies)
	for b := range bodies {
		_ = b.Close()
	}
	cancel()
	return peak
}

// 2,000 SSE streams opened and closed, twice, against the real gateway: no
// descriptor stays open (the count returns to within a small margin of the
// start), every subscriber and Redis channel is released, and memory does
// not grow round over round.
func TestTwoThousandSSEConnectionsTwice(t *testing.T) {
	const n, margin = 2000, 8
	raiseOpenFiles(t, 3*n)
	s := newStack(t)
	gw := s.gateway()
	ids := []string{s.runningTask(time.Hour), s.runningTask(time.Hour), s.runningTask(time.Hour), s.runningTask(time.Hour)}
	// Warm the gateway (gRPC connections, Redis) before the baseline.
	r, _ := s.get(gw + "/v1/tasks")
	require.Equal(t, http.StatusOK, r.StatusCode)
	settle := func(what string, base gatewayLoad) (gatewayLoad, time.Duration) {
		began := time.Now()
		var g gatewayLoad
		require.Eventually(t, func() bool {
			g = s.gatewayLoad(gw)
			return g.subscribers == 0 && g.channels == 0 && g.fds <= base.fds+margin
		}, 30*time.Second, 50*time.Millisecond, "%s: the gateway did not release its streams: %s (start: %s)", what, &g, base)
		return g, time.Since(began)
	}
	start := s.gatewayLoad(gw)
	t.Logf("SSE start: %s", start)
	var after [2]gatewayLoad
	for round := 0; round < 2; round++ {
		began := time.Now()
		peak := s.sseRound(gw, ids, n)
		opened := time.Since(began)
		require.GreaterOrEqual(t, peak.fds, start.fds+n, "every stream holds a descriptor at the peak")
		var took time.Duration
		after[round], took = settle(fmt.Sprintf("round %d", round+1), start)
		t.Logf("SSE round %d: %d streams open and live in %.2f s; peak %s; released %.2f s after the close: %s",
			round+1, n, opened.Seconds(), peak, took.Seconds(), after[round])
	}
	// RSS is logged, not judged: Go returns freed memory to the system
	// lazily. Goroutines are counted exactly: the gateway exposes no Go
	// runtime metrics, so SIGQUIT makes it dump every goroutine's stack and
	// exit (the last thing this test does with it).
	t.Logf("SSE: RSS %.1f MB at the start, %.1f MB after round 1, %.1f MB after round 2",
		float64(start.rssKB)/1024, float64(after[0].rssKB)/1024, float64(after[1].rssKB)/1024)
	goroutines := s.gatewayGoroutines()
	t.Logf("SSE: %d goroutines in the gateway after 2 × %d streams (a leak would leave thousands)", goroutines, n)
	require.Less(t, goroutines, 200, "the gateway kept goroutines of closed streams")
}

// gatewayGoroutines ends the gateway with SIGQUIT and counts the goroutines
// of its stack dump.
func (s *stack) gatewayGoroutines() int {
	s.t.Helper()
	logPath := filepath.Join(s.dir, "gateway.log")
	before, _ := os.ReadFile(logPath)
	require.NoError(s.t, syscall.Kill(s.gatewayPID, syscall.SIGQUIT))
	// Exited (a zombie until the harness reaps it): the dump is complete.
	require.Eventually(s.t, func() bool {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.gatewayPID))
		return err != nil || strings.Contains(string(st), "State:\tZ")
	}, 20*time.Second, 20*time.Millisecond)
	b, err := os.ReadFile(logPath)
	require.NoError(s.t, err)
	dump := string(b[len(before):])
	require.Contains(s.t, dump, "SIGQUIT")
	n := 0
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(l, "goroutine ") && strings.HasSuffix(strings.TrimSpace(l), ":") {
			n++
		}
	}
	require.Positive(s.t, n, "no goroutine in the dump:\n%s", dump)
	return n
}
