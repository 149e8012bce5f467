package bench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Goals of issue 3's acceptance, and issue 17's durable ingest.
const (
	GoalRatioRTT   = 26 * time.Millisecond
	GoalRatio      = 10.0
	GoalP99        = 50 * time.Millisecond
	GoalRate       = 5000.0
	GoalSSEClients = 200
	GoalIngest     = 50000.0 // acked events/s of the new design's unpaced run without added rtt
)

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func rttName(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// WriteTable prints one line per result.
func WriteTable(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "design\tadded rtt\trunners\tsse\tacked/target\twindow s\tacked ev/s\tack p50 ms\tack p99 ms\te2e p50 ms\te2e p95 ms\te2e p99 ms\tserver cpu s/1k ev\tclients cpu s/1k\tpg+redis cpu s/1k\tpeak rss MiB\tsse msgs\tmissing\treconn\t")
	for _, r := range results {
		window := fmt.Sprintf("%.2f", r.Window.Seconds())
		if r.Capped {
			window += " (cap)"
		}
		design := shortDesign(r.Design)
		if r.Rate > 0 {
			design += fmt.Sprintf(" @%.0f/s", r.Rate)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d/%d\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%.3f\t%.0f\t%d\t%d\t%d\t\n",
			design, rttName(r.RTT), r.Runners, r.SSE, r.Acked, r.Target, window, r.EventsPerSec(),
			ms(r.AckLatency.P50), ms(r.AckLatency.P99), ms(r.Latency.P50), ms(r.Latency.P95), ms(r.Latency.P99), r.CPUPer1k(), r.ClientCPUPer1k(), r.ServerCPUPer1k(),
			float64(r.PeakRSSKB)/1024, r.Delivered, r.Missing, r.Reconnects)
	}
	_ = tw.Flush()
}

// Ratio is new/baseline for one added RTT.
type Ratio struct {
	RTT                  time.Duration
	Throughput, CPU, P99 float64
}

// Ratios pairs the unpaced new and baseline results of each RTT.
func Ratios(results []Result) []Ratio {
	var out []Ratio
	for _, n := range results {
		if n.Design != DesignNew || n.Rate > 0 {
			continue
		}
		for _, b := range results {
			if b.Design != DesignBaseline || b.Rate > 0 || b.RTT != n.RTT || b.EventsPerSec() == 0 {
				continue
			}
			r := Ratio{RTT: n.RTT, Throughput: n.EventsPerSec() / b.EventsPerSec()}
			if b.CPUPer1k() > 0 {
				r.CPU = n.CPUPer1k() / b.CPUPer1k()
			}
			if b.Latency.P99 > 0 {
				r.P99 = float64(n.Latency.P99) / float64(b.Latency.P99)
			}
			out = append(out, r)
		}
	}
	return out
}

// WriteRatios prints new/baseline per RTT, then the new design's durable
// ingest beside the physical reference.
func WriteRatios(w io.Writer, results []Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "added rtt\tacked ev/s new÷baseline\tserver cpu/1k new÷baseline\tp99 new÷baseline\t")
	for _, r := range Ratios(results) {
		fmt.Fprintf(tw, "%s\t%.1f×\t%.2f×\t%.2f×\t\n", rttName(r.RTT), r.Throughput, r.CPU, r.P99)
	}
	_ = tw.Flush()
	n, okN := ingestRun(results)
	ref, okRef := referenceRun(results)
	if okN && okRef && ref.EventsPerSec() > 0 {
		fmt.Fprintf(w, "\ndurable ingest, no added rtt: new design %.0f acked ev/s (%d runners, %d SSE clients) beside the physical reference, plain pgx.Batch of %d rows per transaction from %d writers, %.0f rows/s: new÷reference %.2f×\n",
			n.EventsPerSec(), n.Runners, n.SSE, ReferenceBatch, ref.Runners, ref.EventsPerSec(), n.EventsPerSec()/ref.EventsPerSec())
	}
}

// ingestRun is the new design's unpaced run without added rtt: the durable
// ingest figure.
func ingestRun(results []Result) (Result, bool) {
	for _, r := range results {
		if r.Design == DesignNew && r.Rate == 0 && r.RTT == 0 {
			return r, true
		}
	}
	return Result{}, false
}

// referenceRun is the physical reference's run.
func referenceRun(results []Result) (Result, bool) {
	for _, r := range results {
		if r.Design == DesignReference {
			return r, true
		}
	}
	return Result{}, false
}

// Verdict is one goal's outcome.
type Verdict struct {
	Goal, Measured string
	Pass, Run      bool
}

// Goals evaluates the acceptance goals against results.
func Goals(results []Result) []Verdict {
	ratio := Verdict{Goal: fmt.Sprintf("with %s added rtt, new ≥ %.0f× baseline acked events/s", GoalRatioRTT, GoalRatio)}
	for _, r := range Ratios(results) {
		if r.RTT == GoalRatioRTT {
			ratio.Run, ratio.Pass = true, r.Throughput >= GoalRatio
			ratio.Measured = fmt.Sprintf("%.1f×", r.Throughput)
		}
	}
	latency := Verdict{Goal: fmt.Sprintf("no added rtt, p99 e2e < %s at %.0f events/s with %d SSE clients", GoalP99, GoalRate, GoalSSEClients)}
	var trials []Result
	for _, r := range results {
		if r.Design == DesignNew && r.Rate == GoalRate && r.RTT == 0 && r.SSE == GoalSSEClients {
			trials = append(trials, r)
		}
	}
	if len(trials) > 0 {
		// The median trial by p99; every trial must reach the rate and
		// deliver everything.
		sorted := slices.Clone(trials)
		slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.Latency.P99, b.Latency.P99) })
		med := sorted[(len(sorted)-1)/2]
		complete := true
		var p99s []string
		for _, r := range trials {
			complete = complete && r.EventsPerSec() >= 0.95*GoalRate && r.Missing == 0
			p99s = append(p99s, ms(r.Latency.P99))
		}
		latency.Run = true
		latency.Pass = med.Latency.P99 < GoalP99 && complete
		latency.Measured = fmt.Sprintf("p99 %s ms (median of %d trials: %s ms) at %.0f acked ev/s (%d runners), %d SSE messages per trial, %d missing",
			ms(med.Latency.P99), len(trials), strings.Join(p99s, ", "), med.EventsPerSec(), med.Runners, med.Delivered, med.Missing)
		if !complete {
			latency.Measured += "; a trial missed the rate or lost events"
		}
	}
	ingest := Verdict{Goal: fmt.Sprintf("durable ingest ≥ %s events/s (new design, no added rtt)", thousands(GoalIngest))}
	if n, ok := ingestRun(results); ok {
		ingest.Run = true
		ingest.Pass = n.EventsPerSec() >= GoalIngest && !n.Capped && n.Missing == 0
		ingest.Measured = fmt.Sprintf("%.0f acked ev/s (%d runners, %d SSE clients, %d missing)", n.EventsPerSec(), n.Runners, n.SSE, n.Missing)
		if ref, ok := referenceRun(results); ok && ref.EventsPerSec() > 0 {
			ingest.Measured += fmt.Sprintf("; plain pgx.Batch reference in the same run %.0f rows/s, new÷reference %.2f×", ref.EventsPerSec(), n.EventsPerSec()/ref.EventsPerSec())
		}
	}
	return []Verdict{ratio, latency, ingest}
}

// thousands formats v with comma separators ("50,000").
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// WriteGoals prints PASS/FAIL per goal.
func WriteGoals(w io.Writer, results []Result) bool {
	return writeVerdicts(w, Goals(results))
}

// writeVerdicts prints PASS, FAIL or NOT RUN per goal and reports whether
// none failed.
func writeVerdicts(w io.Writer, verdicts []Verdict) bool {
	ok := true
	for _, v := range verdicts {
		state := "NOT RUN"
		switch {
		case v.Run && v.Pass:
			state = "PASS"
		case v.Run:
			state, ok = "FAIL", false
		}
		fmt.Fprintf(w, "%-7s %s: %s\n", state, v.Goal, strings.TrimSpace(v.Measured))
	}
	return ok
}
