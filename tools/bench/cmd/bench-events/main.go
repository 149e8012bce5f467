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

// parseCounts parses "1,2,4" (each 1..64).
func parseCounts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("-committers-sweep: bad count %q (want 1..64)", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("-committers-sweep: no count")
	}
	return out, nil
}

// options are the flags.
type options struct {
	runners, perRunner, sseClients, trials, diffEvery int
	maxBatch, committers, sweepRounds                 int
	rtts                                              []time.Duration
	rate                                              float64
	pacedFor, capFor, drain, batchDelay               time.Duration
	runNew, runBase, runRef, verbose                  bool
	sweep                                             []int
}

func run() error {
	var o options
	flag.IntVar(&o.runners, "runners", 50, "concurrent runners, one task and one connection each")
	flag.IntVar(&o.perRunner, "events", 2000, "events each runner sends in a throughput run")
	flag.IntVar(&o.sseClients, "sse", 200, "SSE clients watching, spread evenly over the runners' tasks")
	rtts := flag.String("rtt", "0,26ms,239ms", "comma-separated round-trip times the delay proxy adds (0 = direct)")
	flag.Float64Var(&o.rate, "rate", bench.GoalRate, "total events/s of the paced latency run of the new design (0 skips it)")
	flag.DurationVar(&o.pacedFor, "paced-duration", 10*time.Second, "how long the paced run sends")
	flag.IntVar(&o.trials, "paced-trials", 3, "how many times the paced run is repeated; the latency goal is judged on the median trial")
	flag.DurationVar(&o.capFor, "duration", 20*time.Second, "cap of each throughput run: nothing is sent after it and an unfinished run is measured over it")
	flag.DurationVar(&o.drain, "drain", 10*time.Second, "how long SSE clients may take to catch up after a run")
	designs := flag.String("designs", "new,baseline,reference", "designs to run: new, baseline, reference (the physical reference: plain pgx.Batch inserts of the same rows, before the new design's run without added rtt), comma-separated")
	flag.IntVar(&o.diffEvery, "diff-every", 100, "every N-th event is a diff_stats report (0: none); the real runner sends two per task")
	flag.IntVar(&o.maxBatch, "max-batch", 0, "events.Config.MaxBatch of the Events service (0: its default)")
	flag.IntVar(&o.committers, "committers", 0, "events.Config.Committers of the Events service (0: its default)")
	flag.DurationVar(&o.batchDelay, "batch-delay", 0, "events.Config.MaxBatchDelay of the Events service (0, its default: no wait)")
	sweep := flag.String("committers-sweep", "", "instead of the comparison, measure the new design with each of these numbers of committers (e.g. 1,2,4): a fresh service per count, its paced trials and its unpaced run without added rtt, in alternation; see make bench-committers")
	flag.IntVar(&o.sweepRounds, "sweep-rounds", 2, "with -committers-sweep: how many times the counts are measured, in alternation (the table shows every round and the median)")
	flag.BoolVar(&o.verbose, "v", false, "log warnings of the servers and clients to stderr, and the server's Go scheduler latency")
	clientMode := flag.Bool("client", false, "internal: be the client process of one scenario (spec on stdin, result on stdout)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (the server process) to this file")
	clientProfile := flag.String("client-cpuprofile", "", "write a CPU profile of each scenario's client process to this file with the client's pid appended")
	flag.Parse()
	if *clientProfile != "" {
		_ = os.Setenv(clientProfileEnv, *clientProfile) // inherited by the client processes
	}

	level := slog.LevelError
	if o.verbose {
		level = slog.LevelWarn
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *clientMode {
		if p := os.Getenv(clientProfileEnv); p != "" {
			stop, err := startProfile(fmt.Sprintf("%s.%d", p, os.Getpid()))
			if err != nil {
				return err
			}
			defer stop()
		}
		return bench.RunClient(ctx, os.Stdin, os.Stdout, logger.With("process", "clients"))
	}
	if *cpuProfile != "" {
		stop, err := startProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	var err error
	if o.rtts, err = parseRTTs(*rtts); err != nil {
		return err
	}
	if o.runners < 1 || o.perRunner < 1 || o.sseClients < 0 {
		return errors.New("-runners and -events must be positive, -sse not negative")
	}
	o.runNew, o.runBase, o.runRef = strings.Contains(*designs, "new"), strings.Contains(*designs, "baseline"), strings.Contains(*designs, "reference")
	if *sweep != "" {
		if o.sweep, err = parseCounts(*sweep); err != nil {
			return err
		}
		return runSweep(ctx, o, logger)
	}
	return runComparison(ctx, o, logger)
}

// clientProfileEnv passes -client-cpuprofile to the client processes.
const clientProfileEnv = "TASKRUNNER_BENCH_CLIENT_CPUPROFILE"

// startProfile writes a CPU profile to path until stop is called.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }, nil
}

// newEnv starts the servers with committers group committers (0: the
// Events service's default).
func newEnv(ctx context.Context, o options, committers int, logger *slog.Logger) (*bench.Env, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding this program to start its client process: %w", err)
	}
	clientCmd := []string{self, "-client"}
	if o.verbose {
		clientCmd = append(clientCmd, "-v")
	}
	return bench.NewEnv(ctx, bench.EnvOptions{BaselineConns: o.runners, Logger: logger, MaxBatch: o.maxBatch, MaxBatchDelay: o.batchDelay, Committers: committers,
		ClientCommand: clientCmd})
}

// pacedScenarios are the latency trials of the new design.
func pacedScenarios(o options) []bench.Scenario {
	if o.rate <= 0 {
		return nil
	}
	n := max(int(o.rate*o.pacedFor.Seconds()/float64(o.runners)), 1)
	var out []bench.Scenario
	for range max(o.trials, 1) {
		out = append(out, bench.Scenario{Design: bench.DesignNew, Runners: o.runners, Events: n, SSE: o.sseClients,
			Rate: o.rate, Cap: o.pacedFor + 15*time.Second, Drain: o.drain, DiffEvery: o.diffEvery})
	}
	return out
}

// comparisonScenarios are the default run's scenarios, in order.
func comparisonScenarios(o options) []bench.Scenario {
	var scenarios []bench.Scenario
	// The latency run comes first: it measures the path at a steady 5,000
	// events/s, not PostgreSQL digesting the WAL of the saturating
	// throughput runs (their checkpoints run for minutes afterwards).
	// Repeated, because one 10 s trial on a shared host is a noisy
	// estimate of a p99: the verdict takes the median trial and shows all.
	if o.runNew {
		scenarios = append(scenarios, pacedScenarios(o)...)
	}
	for _, rtt := range o.rtts {
		base := bench.Scenario{RTT: rtt, Runners: o.runners, Events: o.perRunner, SSE: o.sseClients, Cap: o.capFor, Drain: o.drain, DiffEvery: o.diffEvery}
		if o.runRef && rtt == 0 {
			// The physical reference right before the new design's run, so
			// both meet the same database state (its WAL and checkpoints).
			s := base
			s.Design, s.SSE = bench.DesignReference, 0
			scenarios = append(scenarios, s)
		}
		if o.runNew {
			s := base
			s.Design = bench.DesignNew
			scenarios = append(scenarios, s)
		}
		if o.runBase {
			s := base
			s.Design = bench.DesignBaseline
			scenarios = append(scenarios, s)
		}
	}
	return scenarios
}

// runScenarios runs scenarios in order, with a progress line each on
// stderr.
func runScenarios(ctx context.Context, env *bench.Env, o options, scenarios []bench.Scenario, label string) ([]bench.Result, error) {
	var results []bench.Result
	for i, sc := range scenarios {
		paced := "as fast as acknowledged"
		if sc.Rate > 0 {
			paced = fmt.Sprintf("paced at %.0f events/s", sc.Rate)
		}
		fmt.Fprintf(os.Stderr, "[%s%d/%d] %s, added rtt %s, %s …", label, i+1, len(scenarios), sc.Design, sc.RTT, paced)
		t0 := time.Now()
		r, err := env.Run(ctx, sc)
		if err != nil {
			fmt.Fprintln(os.Stderr)
			return nil, fmt.Errorf("%s at rtt %s: %w", sc.Design, sc.RTT, err)
		}
		fmt.Fprintf(os.Stderr, " %.0f acked ev/s, p99 %s (%.1fs)\n", r.EventsPerSec(), r.Latency.P99.Round(100*time.Microsecond), time.Since(t0).Seconds())
		if o.verbose {
			fmt.Fprintf(os.Stderr, "  server Go scheduler latency (runnable → running): p50 %s p99 %s max %s; host CPU idle %.0f%%, stolen by the hypervisor %.1f%%\n",
				r.Sched.P50, r.Sched.P99, r.Sched.Max, r.Host.Idle, r.Host.Steal)
			if r.SSEErr != "" {
				fmt.Fprintln(os.Stderr, "  first SSE reconnect cause:", r.SSEErr)
			}
		}
		results = append(results, r)
	}
	return results, nil
}

// printHeader prints what the figures come from and returns the host's CPU
// steal since then, for the footer.
func printHeader(ctx context.Context, env *bench.Env, o options) (steal func() string) {
	fmt.Printf("bench-events: GOMAXPROCS=%d NumCPU=%d %s; PostgreSQL synchronous_commit=%s fsync=%s; database %s (dropped at exit), Redis prefix %q\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), env.SynchronousCommit, env.Fsync, env.DBName(), env.Prefix)
	probe(ctx, env, "at start")
	steal = bench.Steal()
	fmt.Printf("host: %s; load average at start: %s (other work on the machine skews every figure)\n", bench.Host(), bench.LoadAvg())
	fmt.Printf("workload: %d runners × %d events (~200-byte log tails, stage changes explore→propose→apply→archive, diff stats every %dth), %d SSE clients; throughput runs capped at %s\n\n",
		o.runners, o.perRunner, o.diffEvery, o.sseClients, o.capFor)
	return steal
}

func probe(ctx context.Context, env *bench.Env, when string) {
	if l, err := env.CommitLatency(ctx, 100); err == nil {
		fmt.Printf("PostgreSQL commit latency %s (100 sequential single-row autocommit inserts): p50 %s ms, p99 %s ms\n", when, bench.Millis(l.P50), bench.Millis(l.P99))
	}
}

// runComparison is the default run: the new design against the baseline,
// the physical reference, the goals.
func runComparison(ctx context.Context, o options, logger *slog.Logger) error {
	began := time.Now()
	env, err := newEnv(ctx, o, o.committers, logger)
	if err != nil {
		return err
	}
	defer env.Close()
	steal := printHeader(ctx, env, o)
	fmt.Printf("events service: %d group committer(s)\n\n", env.Committers)

	results, err := runScenarios(ctx, env, o, comparisonScenarios(o), "")
	if err != nil {
		return err
	}
	fmt.Println()
	bench.WriteTable(os.Stdout, results)
	fmt.Println()
	bench.WriteRatios(os.Stdout, results)
	fmt.Println()
	bench.WriteGoals(os.Stdout, results)
	fmt.Println()
	fmt.Println("acked ev/s: events the server acknowledged (new: Ack after group commit; baseline: 2xx after insert+publish; pgx.Batch: rows committed) over the window, first send to last ack, or to the cap when marked (cap).")
	fmt.Println("ack: runner send → acknowledgement (new: polled every 1 ms; pgx.Batch: one transaction of 100 rows). e2e: runner send → SSE client receive, every client's copy. Unpaced new-design runs send everything at once, so their latency is mostly queueing; the paced run is the latency figure.")
	fmt.Println("server cpu: the server process (new: Events + Task services and the gateway's SSE handler; baseline: its callback handler and the same SSE handler; pgx.Batch: its writers) user+sys; clients cpu: the client process (runners, SSE clients, delay proxy); pg+redis: local postgres and redis-server processes (approximate). peak rss: VmHWM of the server process, reset per run.")
	probe(ctx, env, "at end")
	fmt.Printf("total %.0fs; host load average at end: %s; CPU steal over the run: %s (the hypervisor running others on this machine's CPUs)\n", time.Since(began).Seconds(), bench.LoadAvg(), steal())
	return nil
}

// runSweep measures the new design with each number of committers in
// o.sweep: per round and count, a fresh Events service (and database), its
// paced trials and one unpaced run without added rtt; the counts alternate
// within each round so that drift on the host spreads over all of them.
func runSweep(ctx context.Context, o options, logger *slog.Logger) error {
	began := time.Now()
	steal := bench.Steal()
	fmt.Printf("bench-events committers sweep: GOMAXPROCS=%d NumCPU=%d %s; committers %v, %d round(s); host: %s; load average at start: %s\n",
		runtime.GOMAXPROCS(0), runtime.NumCPU(), runtime.Version(), o.sweep, o.sweepRounds, bench.Host(), bench.LoadAvg())
	fmt.Printf("workload: %d runners × %d events, %d SSE clients; paced: %.0f events/s for %s, %d trial(s)\n\n",
		o.runners, o.perRunner, o.sseClients, o.rate, o.pacedFor, o.trials)
	var points []bench.SweepPoint
	for round := range max(o.sweepRounds, 1) {
		for _, c := range o.sweep {
			p, err := sweepPoint(ctx, o, c, round, logger)
			if err != nil {
				return err
			}
			points = append(points, p)
		}
	}
	bench.WriteSweep(os.Stdout, points)
	fmt.Printf("\ntotal %.0fs; host load average at end: %s; CPU steal over the run: %s\n", time.Since(began).Seconds(), bench.LoadAvg(), steal())
	return nil
}

func sweepPoint(ctx context.Context, o options, committers, round int, logger *slog.Logger) (bench.SweepPoint, error) {
	env, err := newEnv(ctx, o, committers, logger)
	if err != nil {
		return bench.SweepPoint{}, err
	}
	defer env.Close()
	scenarios := pacedScenarios(o)
	scenarios = append(scenarios, bench.Scenario{Design: bench.DesignNew, Runners: o.runners, Events: o.perRunner, SSE: o.sseClients, Cap: o.capFor, Drain: o.drain, DiffEvery: o.diffEvery})
	results, err := runScenarios(ctx, env, o, scenarios, fmt.Sprintf("round %d, %d committer(s): ", round+1, committers))
	if err != nil {
		return bench.SweepPoint{}, err
	}
	return bench.SweepPoint{Committers: committers, Round: round + 1, Cores: runtime.GOMAXPROCS(0), Results: results}, nil
}
