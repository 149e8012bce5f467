package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/taskrunner/taskrunner/tools/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-sse:", err)
		os.Exit(1)
	}
}

func parseInts(name, s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-%s: bad count %q", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run() error {
	subsFlag := flag.String("subs", "100,1000", "subscriber counts of the one-task fan-out scenarios (empty: none)")
	events := flag.Int("events", 500, "events of each one-task sequential run")
	rate := flag.Float64("rate", 50, "events/s of the paced one-task runs (0 skips them)")
	pacedFor := flag.Duration("paced-duration", 5*time.Second, "how long a paced run publishes")
	tasks := flag.Int("tasks", 50, "tasks of the N tasks × M subscribers scenario (0 skips it)")
	tasksSubs := flag.Int("tasks-subs", 20, "subscribers per task of the N × M scenario")
	tasksEvents := flag.Int("tasks-events", 50, "events per task of the N × M scenario (one sequential publisher per task)")
	idleFlag := flag.String("idle", "1000,5000,10000", "connection counts of the idle scenarios; each one's connects are also the connect storm (empty: none)")
	perTask := flag.Int("idle-per-task", 10, "idle subscribers per task")
	concurrency := flag.Int("concurrency", 256, "connects in flight at once (dial until the stream's first line)")
	settle := flag.Duration("settle", 2*time.Second, "how long idle connections stay open before the server's RSS is read")
	drain := flag.Duration("drain", 60*time.Second, "how long subscribers may take to receive every event after the last publish")
	hubs := flag.String("hubs", "taskrunner,mercure", "hubs to measure: taskrunner, mercure or both")
	verbose := flag.Bool("v", false, "log warnings of the servers and clients to stderr")
	clientMode := flag.Bool("client", false, "internal: be the client process of one scenario (spec on stdin, result on stdout)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the server process over the whole run to this file")
	memProfile := flag.String("memprofile", "", "write the server process's allocations over the whole run (a heap profile; go tool pprof -sample_index=alloc_space) to this file")
	flag.Parse()

	level := slog.LevelError
	if *verbose {
		level = slog.LevelWarn
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *clientMode {
		return bench.RunSSEClient(ctx, os.Stdin, os.Stdout, logger.With("process", "clients"))
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			return fmt.Errorf("-memprofile: %w", err)
		}
		defer f.Close()
		defer func() {
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				logger.Warn("bench-sse: -memprofile not written", "error", err)
			}
		}()
	}
	subs, err := parseInts("subs", *subsFlag)
	if err != nil {
		return err
	}
	idle, err := parseInts("idle", *idleFlag)
	if err != nil {
		return err
	}
	if *events < 1 || *tasksEvents < 1 || *tasksSubs < 1 || *perTask < 1 {
		return errors.New("-events, -tasks-events, -tasks-subs and -idle-per-task must be positive")
	}
	var hubList []string
	for _, h := range []string{bench.HubTaskrunner, bench.HubMercure} {
		if strings.Contains(*hubs, h) {
			hubList = append(hubList, h)
		}
	}
	// 10,000 connections need 10,000 descriptors on each side (this
	// process and the client process, which raises its own).
	maxConns := *tasks * *tasksSubs
	for _, n := range append(subs, idle...) {
		maxConns = max(maxConns, n)
	}
	nofile, err := bench.RaiseFileLimit(uint64(maxConns) + 1024)
	if err != nil {
		return fmt.Errorf("raising the open-file limit: %w", err)
	}
	if nofile < uint64(maxConns)+256 {
		return fmt.Errorf("the open-file limit is %d, too low for %d connections: raise the hard limit (ulimit -Hn) or use smaller -idle", nofile, maxConns)
	}

	began := time.Now()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to start its client process: %w", err)
	}
	clientCmd := []string{self, "-client"}
	if *verbose {
		clientCmd = append(clientCmd, "-v")
	}
	env, err := bench.NewSSEEnv(ctx, logger, clientCmd)
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Printf("bench-sse: GOMAXPROCS=%d NumCPU=%d %s; open-file limit %d (each process raises its own with setrlimit when lower than it needs); database %s (dropped at exit), Redis prefix %q\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), nofile, env.DBName(), env.Prefix)
	steal := bench.Steal()
	fmt.Printf("host: %s; load average at start: %s (other work on the machine skews every figure)\n\n", bench.Host(), bench.LoadAvg())

	var scenarios []bench.SSEScenario
	add := func(sc bench.SSEScenario) {
		sc.Drain, sc.Concurrency, sc.Settle = *drain, *concurrency, *settle
		for _, h := range hubList {
			sc.Hub = h
			scenarios = append(scenarios, sc)
		}
	}
	for _, n := range subs {
		add(bench.SSEScenario{Name: fmt.Sprintf("1×%d seq", n), Kind: bench.KindFanout, Tasks: 1, Subs: n, Events: *events})
		if *rate > 0 {
			add(bench.SSEScenario{Name: fmt.Sprintf("1×%d paced", n), Kind: bench.KindFanout, Tasks: 1, Subs: n, Rate: *rate,
				Events: max(int(*rate*pacedFor.Seconds()), 1)})
		}
	}
	if *tasks > 0 {
		add(bench.SSEScenario{Name: fmt.Sprintf("%d×%d seq", *tasks, *tasksSubs), Kind: bench.KindFanout, Tasks: *tasks, Subs: *tasksSubs, Events: *tasksEvents})
	}
	for _, n := range idle {
		add(bench.SSEScenario{Name: fmt.Sprintf("idle %d", n), Kind: bench.KindIdle, Tasks: max(n / *perTask, 1), Subs: min(*perTask, n)})
	}

	var results []bench.SSEResult
	for i, sc := range scenarios {
		fmt.Fprintf(os.Stderr, "[%d/%d] %s on %s …", i+1, len(scenarios), sc.Name, sc.Hub)
		t0 := time.Now()
		r, err := env.RunSSE(ctx, sc)
		if err != nil {
			fmt.Fprintln(os.Stderr)
			return fmt.Errorf("%s on %s: %w", sc.Name, sc.Hub, err)
		}
		if sc.Kind == bench.KindFanout {
			fmt.Fprintf(os.Stderr, " %.0f deliveries/s, p99 %s ms, %d lost, %d dup (%.1fs)\n", r.DeliveriesPerSec(), bench.Millis(r.Latency.P99), r.Lost, r.Duplicates, time.Since(t0).Seconds())
		} else {
			fmt.Fprintf(os.Stderr, " %d connected in %.1fs, %.2f server cpu s, %.1f KiB/conn (%.1fs)\n", int64(r.Connections())-r.ConnectFailed, r.Window.Seconds(),
				r.ServerCPU.Seconds(), r.RSSPerConnKiB(), time.Since(t0).Seconds())
		}
		results = append(results, r)
	}

	fmt.Println()
	bench.WriteSSEFanout(os.Stdout, results)
	fmt.Println()
	bench.WriteSSEIdle(os.Stdout, results)
	fmt.Println()
	fmt.Println("taskrunner ÷ mercure:")
	bench.WriteSSERatios(os.Stdout, results)
	fmt.Println()
	bench.WriteSSEGoals(os.Stdout, results)
	fmt.Println()
	fmt.Println("deliveries/s: events received by all subscribers over the window from the first publish to the last receipt. ack: publish → acknowledgement (taskrunner: the Events service's Ack after the PostgreSQL commit (eventsclient.WaitAcked); mercure: the POST's answer after the Bolt write). e2e: publish → receipt, every subscriber's copy; first / last copy: per event, its fastest and its slowest subscriber's publish → receipt (the first is the way into the hub and through it, the spread to the last is the fan-out). writer rounds (taskrunner): its task writers' rounds over their parked streams that wrote something, from the gateway's taskrunner.sse.round_duration histogram (quarter-millisecond buckets, bucket upper bounds); a round is the longest an event waits in the hub for its last subscriber's write.")
	fmt.Println("server cpu: this process (taskrunner: Events + Task services and the gateway's SSE handler; mercure: the embedded hub) user+sys over the run (idle: the connects); pg+redis: local postgres and redis-server processes (approximate, and shared with anything else on the host); clients cpu: the client process (publishers and subscribers).")
	fmt.Println("rss/conn: VmRSS growth of this process (after GC and returning freed memory to the OS) from before the connects to with every connection open, ÷ connections. The connect storm is each idle scenario's connect phase.")
	fmt.Printf("total %.0fs; host load average at end: %s; CPU steal over the run: %s (the hypervisor running others on this machine's CPUs)\n", time.Since(began).Seconds(), bench.LoadAvg(), steal())

	var bad []string
	for _, r := range results {
		if !r.Complete() {
			bad = append(bad, fmt.Sprintf("%s on %s (%d lost, %d duplicated, %d never connected, %d publish errors; first error: %s)",
				r.Name, r.Hub, r.Lost, r.Duplicates, r.ConnectFailed, r.PublishErrors, r.FirstErr))
		}
	}
	if len(bad) > 0 {
		return errors.New("events lost or duplicated, or connections failed: " + strings.Join(bad, "; "))
	}
	return nil
}
