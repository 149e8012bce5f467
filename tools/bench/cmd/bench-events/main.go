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
	"strings"
	"syscall"
	"time"

	"github.com/taskrunner/taskrunner/tools/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-events:", err)
		os.Exit(1)
	}
}

func parseRTTs(s string) ([]time.Duration, error) {
	var out []time.Duration
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "0" {
			out = append(out, 0)
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("-rtt: bad duration %q", f)
		}
		out = append(out, d)
	}
	return out, nil
}

func run() error {
	runners := flag.Int("runners", 50, "concurrent runners, one task and one connection each")
	perRunner := flag.Int("events", 2000, "events each runner sends in a throughput run")
	sseClients := flag.Int("sse", 200, "SSE clients watching, spread evenly over the runners' tasks")
	rtts := flag.String("rtt", "0,26ms,239ms", "comma-separated round-trip times the delay proxy adds (0 = direct)")
	rate := flag.Float64("rate", bench.GoalRate, "total events/s of the paced latency run of the new design (0 skips it)")
	pacedFor := flag.Duration("paced-duration", 10*time.Second, "how long the paced run sends")
	trials := flag.Int("paced-trials", 3, "how many times the paced run is repeated; the latency goal is judged on the median trial")
	capFor := flag.Duration("duration", 20*time.Second, "cap of each throughput run: nothing is sent after it and an unfinished run is measured over it")
	drain := flag.Duration("drain", 10*time.Second, "how long SSE clients may take to catch up after a run")
	designs := flag.String("designs", "new,baseline", "designs to run: new, baseline or both")
	diffEvery := flag.Int("diff-every", 100, "every N-th event is a diff_stats report (0: none); the real runner sends two per task")
	maxBatch := flag.Int("max-batch", 0, "events.Config.MaxBatch of the Events service (0: its default)")
	committers := flag.Int("committers", 0, "events.Config.Committers of the Events service (0: its default)")
	batchDelay := flag.Duration("batch-delay", 0, "events.Config.MaxBatchDelay of the Events service (0, its default: no wait)")
	verbose := flag.Bool("v", false, "log warnings of the servers and clients to stderr, and the server's Go scheduler latency")
	clientMode := flag.Bool("client", false, "internal: be the client process of one scenario (spec on stdin, result on stdout)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *clientMode {
		level := slog.LevelError
		if *verbose {
			level = slog.LevelWarn
		}
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return bench.RunClient(ctx, os.Stdin, os.Stdout, logger.With("process", "clients"))
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench-events: -cpuprofile:", err)
			os.Exit(2)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench-events: -cpuprofile:", err)
			os.Exit(2)
		}
		defer pprof.StopCPUProfile()
	}
	rttList, err := parseRTTs(*rtts)
	switch {
	case err != nil:
		return err
	case *runners < 1 || *perRunner < 1 || *sseClients < 0:
		return errors.New("-runners and -events must be positive, -sse not negative")
	}
	runNew, runBase := strings.Contains(*designs, "new"), strings.Contains(*designs, "baseline")

	level := slog.LevelError
	if *verbose {
		level = slog.LevelWarn
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	began := time.Now()
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this program to start its client process: %w", err)
	}
	clientCmd := []string{self, "-client"}
	if *verbose {
		clientCmd = append(clientCmd, "-v")
	}
	env, err := bench.NewEnv(ctx, bench.EnvOptions{BaselineConns: *runners, Logger: logger, MaxBatch: *maxBatch, MaxBatchDelay: *batchDelay, Committers: *committers,
		ClientCommand: clientCmd})
	if err != nil {
		return err
	}
	defer env.Close()

	fmt.Printf("bench-events: GOMAXPROCS=%d NumCPU=%d %s; PostgreSQL synchronous_commit=%s fsync=%s; database %s (dropped at exit), Redis prefix %q\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), env.SynchronousCommit, env.Fsync, env.DBName(), env.Prefix)
	probe := func(when string) {
		if l, err := env.CommitLatency(ctx, 100); err == nil {
			fmt.Printf("PostgreSQL commit latency %s (100 sequential single-row autocommit inserts): p50 %s ms, p99 %s ms\n", when, bench.Millis(l.P50), bench.Millis(l.P99))
		}
	}
	probe("at start")
	fmt.Printf("host load average at start: %s (other work on the machine skews every figure)\n", bench.LoadAvg())
	fmt.Printf("workload: %d runners × %d events (~200-byte log tails, stage changes explore→propose→apply→archive, diff stats every %dth), %d SSE clients; throughput runs capped at %s\n\n",
		*runners, *perRunner, *diffEvery, *sseClients, *capFor)

	var scenarios []bench.Scenario
	// The latency run comes first: it measures the path at a steady 5,000
	// events/s, not PostgreSQL digesting the WAL of the saturating
	// throughput runs (their checkpoints run for minutes afterwards).
	// Repeated, because one 10 s trial on a shared host is a noisy
	// estimate of a p99: the verdict takes the median trial and shows all.
	if runNew && *rate > 0 {
		n := max(int(*rate*pacedFor.Seconds()/float64(*runners)), 1)
		for range max(*trials, 1) {
			scenarios = append(scenarios, bench.Scenario{Design: bench.DesignNew, Runners: *runners, Events: n, SSE: *sseClients,
				Rate: *rate, Cap: *pacedFor + 15*time.Second, Drain: *drain, DiffEvery: *diffEvery})
		}
	}

	for _, rtt := range rttList {
		base := bench.Scenario{RTT: rtt, Runners: *runners, Events: *perRunner, SSE: *sseClients, Cap: *capFor, Drain: *drain, DiffEvery: *diffEvery}
		if runNew {
			s := base
			s.Design = bench.DesignNew
			scenarios = append(scenarios, s)
		}
		if runBase {
			s := base
			s.Design = bench.DesignBaseline
			scenarios = append(scenarios, s)
		}
	}
	var results []bench.Result
	for i, sc := range scenarios {
		paced := "as fast as acknowledged"
		if sc.Rate > 0 {
			paced = fmt.Sprintf("paced at %.0f events/s", sc.Rate)
		}
		fmt.Fprintf(os.Stderr, "[%d/%d] %s, added rtt %s, %s …", i+1, len(scenarios), sc.Design, sc.RTT, paced)
		t0 := time.Now()
		r, err := env.Run(ctx, sc)
		if err != nil {
			fmt.Fprintln(os.Stderr)
			return fmt.Errorf("%s at rtt %s: %w", sc.Design, sc.RTT, err)
		}
		fmt.Fprintf(os.Stderr, " %.0f acked ev/s, p99 %s (%.1fs)\n", r.EventsPerSec(), r.Latency.P99.Round(100*time.Microsecond), time.Since(t0).Seconds())
		if *verbose {
			fmt.Fprintf(os.Stderr, "  server Go scheduler latency (runnable → running): p50 %s p99 %s max %s; host CPU idle %.0f%%, stolen by the hypervisor %.1f%%\n",
				r.Sched.P50, r.Sched.P99, r.Sched.Max, r.Host.Idle, r.Host.Steal)
			if r.SSEErr != "" {
				fmt.Fprintln(os.Stderr, "  first SSE reconnect cause:", r.SSEErr)
			}
		}
		results = append(results, r)
	}

	fmt.Println()
	bench.WriteTable(os.Stdout, results)
	fmt.Println()
	bench.WriteRatios(os.Stdout, results)
	fmt.Println()
	bench.WriteGoals(os.Stdout, results)
	fmt.Println()
	fmt.Println("acked ev/s: events the server acknowledged (new: Ack after group commit; baseline: 2xx after insert+publish) over the window, first send to last ack, or to the cap when marked (cap).")
	fmt.Println("ack: runner send → acknowledgement (new: polled every 1 ms). e2e: runner send → SSE client receive, every client's copy. Unpaced new-design runs send everything at once, so their latency is mostly queueing; the paced run is the latency figure.")
	fmt.Println("server cpu: the server process (new: Events + Task services and the gateway's SSE handler; baseline: its callback handler and the same SSE handler) user+sys; clients cpu: the client process (runners, SSE clients, delay proxy); pg+redis: local postgres and redis-server processes (approximate). peak rss: VmHWM of the server process, reset per run.")
	probe("at end")
	fmt.Printf("total %.0fs; host load average at end: %s\n", time.Since(began).Seconds(), bench.LoadAvg())
	return nil
}
