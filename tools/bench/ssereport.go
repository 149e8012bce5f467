package bench

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// Goals of issue 17 (taskrunner against the reference hub, Mercure).
const (
	GoalFanoutSubs      = 1000
	GoalDeliveriesRatio = 2.0 // deliveries/s ≥ 2× the reference's
	GoalFanoutP99Ratio  = 0.5 // p99 ≤ half the reference's
	GoalIdleConns       = 10000
	GoalIdleKiB         = 20.0 // RSS per idle connection
	GoalIdleRatio       = 0.55 // … and ≤ 0.55× the reference's
	GoalConnectCPURatio = 1.5  // 10,000 connects ≤ 1.5× the reference's CPU-seconds
)

func publisherName(s SSEScenario) string {
	if s.Rate > 0 {
		return fmt.Sprintf("paced %.0f/s", s.Rate)
	}
	return "sequential"
}

// WriteSSEFanout prints one line per fan-out result.
func WriteSSEFanout(w io.Writer, results []SSEResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\thub\ttasks×subs\tpublisher\tpublished\tdelivered/expected\tdup\tlost\treconn\tdeliveries/s\tack p50 ms\te2e p50 ms\te2e p99 ms\tfirst copy p50 ms\tlast copy p50 ms\tlast copy p99 ms\twriter rounds\tround p50 ms\tround p99 ms\tserver cpu s\tpg+redis cpu s\tclients cpu s\t")
	for _, r := range results {
		if r.Kind != KindFanout {
			continue
		}
		rounds, r50, r99 := "-", "-", "-"
		if r.Rounds.N > 0 {
			rounds, r50, r99 = fmt.Sprint(r.Rounds.N), ms(r.Rounds.P50), ms(r.Rounds.P99)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d×%d\t%s\t%d\t%d/%d\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t\n",
			r.Name, r.Hub, r.Tasks, r.Subs, publisherName(r.SSEScenario), r.Published, r.Delivered, r.Expected, r.Duplicates, r.Lost, r.Reconnects,
			r.DeliveriesPerSec(), ackP50(r), ms(r.Latency.P50), ms(r.Latency.P99), ms(r.FirstCopy.P50), ms(r.LastCopy.P50), ms(r.LastCopy.P99),
			rounds, r50, r99, r.ServerCPU.Seconds(), r.PGRedisCPU.Seconds(), r.CPU.Seconds())
	}
	_ = tw.Flush()
}

// ackP50 is "-" for a paced publisher, which does not wait for its acks.
func ackP50(r SSEResult) string {
	if r.Ack.N == 0 {
		return "-"
	}
	return ms(r.Ack.P50)
}

// WriteSSEIdle prints one line per idle result.
func WriteSSEIdle(w io.Writer, results []SSEResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\thub\tconnections\tconnected\tconnect s\tconnect p50 ms\tconnect p99 ms\tserver cpu s\tpg+redis cpu s\tclients cpu s\trss before MiB\trss after MiB\trss/conn KiB\t")
	for _, r := range results {
		if r.Kind != KindIdle {
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.2f\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.1f\t%.1f\t%.1f\t\n",
			r.Name, r.Hub, r.Connections(), int64(r.Connections())-r.ConnectFailed, r.Window.Seconds(), ms(r.Connect.P50), ms(r.Connect.P99),
			r.ServerCPU.Seconds(), r.PGRedisCPU.Seconds(), r.CPU.Seconds(), float64(r.RSSBeforeKB)/1024, float64(r.RSSAfterKB)/1024, r.RSSPerConnKiB())
	}
	_ = tw.Flush()
}

// SSEPair is one scenario on both hubs.
type SSEPair struct{ Taskrunner, Mercure SSEResult }

// SSEPairs matches each taskrunner result with Mercure's of the same
// scenario, in order.
func SSEPairs(results []SSEResult) []SSEPair {
	var out []SSEPair
	for _, t := range results {
		if t.Hub != HubTaskrunner {
			continue
		}
		for _, m := range results {
			if m.Hub == HubMercure && m.Name == t.Name {
				out = append(out, SSEPair{t, m})
				break
			}
		}
	}
	return out
}

func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// WriteSSERatios prints taskrunner ÷ Mercure per scenario.
func WriteSSERatios(w io.Writer, results []SSEResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tdeliveries/s\te2e p50\te2e p99\tserver cpu\tserver+pg+redis cpu\tclients cpu\trss/conn\t")
	for _, p := range SSEPairs(results) {
		t, m := p.Taskrunner, p.Mercure
		dps, p50, p99, rss := "-", "-", "-", "-"
		if t.Kind == KindFanout {
			dps, p50, p99 = ratio(t.DeliveriesPerSec(), m.DeliveriesPerSec()), ratio(float64(t.Latency.P50), float64(m.Latency.P50)), ratio(float64(t.Latency.P99), float64(m.Latency.P99))
		} else {
			rss = ratio(t.RSSPerConnKiB(), m.RSSPerConnKiB())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t.Name, dps, p50, p99,
			ratio(t.ServerCPU.Seconds(), m.ServerCPU.Seconds()), ratio(t.TotalServerCPU().Seconds(), m.TotalServerCPU().Seconds()), ratio(t.CPU.Seconds(), m.CPU.Seconds()), rss)
	}
	_ = tw.Flush()
}

// SSEGoals evaluates issue 17's goals.
func SSEGoals(results []SSEResult) []Verdict {
	fan := Verdict{Goal: fmt.Sprintf("1 task × %d subscribers, sequential publisher: deliveries/s ≥ %.0f× Mercure's and e2e p99 ≤ %.1f× Mercure's", GoalFanoutSubs, GoalDeliveriesRatio, GoalFanoutP99Ratio)}
	idle := Verdict{Goal: fmt.Sprintf("%d idle SSE connections: ≤ %.0f KiB RSS each and ≤ %.2f× Mercure's", GoalIdleConns, GoalIdleKiB, GoalIdleRatio)}
	storm := Verdict{Goal: fmt.Sprintf("%d connects: server CPU-seconds (taskrunner: its process + PostgreSQL + Redis) ≤ %.1f× Mercure's", GoalIdleConns, GoalConnectCPURatio)}
	for _, p := range SSEPairs(results) {
		t, m := p.Taskrunner, p.Mercure
		switch {
		case t.Kind == KindFanout && t.Tasks == 1 && t.Subs == GoalFanoutSubs && t.Rate == 0:
			d := t.DeliveriesPerSec() / max(m.DeliveriesPerSec(), 1e-9)
			l := float64(t.Latency.P99) / max(float64(m.Latency.P99), 1)
			fan.Run, fan.Pass = true, d >= GoalDeliveriesRatio && l <= GoalFanoutP99Ratio && t.Complete()
			fan.Measured = fmt.Sprintf("%.0f vs %.0f deliveries/s (%.2f×); p99 %s vs %s ms (%.2f×)", t.DeliveriesPerSec(), m.DeliveriesPerSec(), d, ms(t.Latency.P99), ms(m.Latency.P99), l)
		case t.Kind == KindIdle && t.Connections() == GoalIdleConns:
			r := t.RSSPerConnKiB() / max(m.RSSPerConnKiB(), 1e-9)
			idle.Run, idle.Pass = true, t.RSSPerConnKiB() <= GoalIdleKiB && r <= GoalIdleRatio && t.Complete()
			idle.Measured = fmt.Sprintf("%.1f KiB vs Mercure's %.1f KiB (%.2f×)", t.RSSPerConnKiB(), m.RSSPerConnKiB(), r)
			c := t.TotalServerCPU().Seconds() / max(m.TotalServerCPU().Seconds(), 1e-9)
			storm.Run, storm.Pass = true, c <= GoalConnectCPURatio && t.Complete()
			storm.Measured = fmt.Sprintf("%.2f s (process %.2f + pg/redis %.2f) vs Mercure's %.2f s (%.2f×), in %.1f s vs %.1f s",
				t.TotalServerCPU().Seconds(), t.ServerCPU.Seconds(), t.PGRedisCPU.Seconds(), m.ServerCPU.Seconds(), c, t.Window.Seconds(), m.Window.Seconds())
		}
	}
	return []Verdict{fan, idle, storm}
}

// WriteSSEGoals prints PASS/FAIL per goal and reports whether all passed.
func WriteSSEGoals(w io.Writer, results []SSEResult) bool {
	return writeVerdicts(w, SSEGoals(results))
}
