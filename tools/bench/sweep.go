package bench

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// SweepPoint is one measurement of bench-events' committers sweep: the new
// design with Committers group committers on Cores cores (GOMAXPROCS), its
// paced trials and its unpaced run without added rtt, in Results.
type SweepPoint struct {
	Committers, Round, Cores int
	Results                  []Result
}

// throughput is the point's unpaced run.
func (p SweepPoint) throughput() (Result, bool) { return ingestRun(p.Results) }

// paced is the point's median paced trial by p99, every trial's p99, and
// whether every trial reached 95 % of the rate and lost nothing.
func (p SweepPoint) paced() (med Result, p99s []time.Duration, complete bool) {
	var trials []Result
	for _, r := range p.Results {
		if r.Rate > 0 {
			trials = append(trials, r)
		}
	}
	if len(trials) == 0 {
		return Result{}, nil, false
	}
	complete = true
	for _, r := range trials {
		p99s = append(p99s, r.Latency.P99)
		complete = complete && r.EventsPerSec() >= 0.95*r.Rate && r.Missing == 0
	}
	sorted := slices.Clone(trials)
	slices.SortFunc(sorted, func(a, b Result) int { return cmp.Compare(a.Latency.P99, b.Latency.P99) })
	return sorted[(len(sorted)-1)/2], p99s, complete
}

// WriteSweep prints every point, then per number of committers the median
// over rounds of the acked events/s and of the median paced p99.
func WriteSweep(w io.Writer, points []SweepPoint) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cores\tcommitters\tround\tacked ev/s\tserver cpu s/1k\tpg+redis cpu s/1k\thost idle %\tpaced p99 ms (median; trials)\tpaced complete\t")
	for _, p := range points {
		t, _ := p.throughput()
		med, p99s, complete := p.paced()
		var trials []string
		for _, d := range p99s {
			trials = append(trials, ms(d))
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.0f\t%s; %s\t%t\t\n", p.Cores, p.Committers, p.Round, t.EventsPerSec(), t.CPUPer1k(), t.ServerCPUPer1k(),
			t.Host.Idle, ms(med.Latency.P99), strings.Join(trials, ", "), complete)
	}
	_ = tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cores\tcommitters\tacked ev/s (median of rounds)\tpaced p99 ms (median of rounds)\t")
	for _, s := range SweepSummary(points) {
		fmt.Fprintf(tw, "%d\t%d\t%.0f\t%s\t\n", s.Cores, s.Committers, s.EventsPerSec, ms(s.PacedP99))
	}
	_ = tw.Flush()
}

// SweepRow is one number of committers' summary over rounds.
type SweepRow struct {
	Cores, Committers int
	EventsPerSec      float64       // median over rounds of the unpaced run's acked events/s
	PacedP99          time.Duration // median over rounds of the median paced trial's p99
}

// SweepSummary summarises points per (cores, committers), in the order
// they first appear.
func SweepSummary(points []SweepPoint) []SweepRow {
	type key struct{ cores, committers int }
	var order []key
	evs := map[key][]float64{}
	p99 := map[key][]time.Duration{}
	for _, p := range points {
		k := key{p.Cores, p.Committers}
		if _, seen := evs[k]; !seen {
			order = append(order, k)
		}
		t, _ := p.throughput()
		evs[k] = append(evs[k], t.EventsPerSec())
		if med, p99s, _ := p.paced(); len(p99s) > 0 {
			p99[k] = append(p99[k], med.Latency.P99)
		}
	}
	var out []SweepRow
	for _, k := range order {
		row := SweepRow{Cores: k.cores, Committers: k.committers, EventsPerSec: median(evs[k])}
		if d := p99[k]; len(d) > 0 {
			row.PacedP99 = median(d)
		}
		out = append(out, row)
	}
	return out
}

// median is the middle value, or the mean of the two middle ones.
func median[T ~int64 | ~float64](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}
