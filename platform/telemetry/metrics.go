package telemetry

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// MetricsPage serves a process's OpenTelemetry metrics as a Prometheus text
// page (exposition format 0.0.4), read at scrape time from an SDK reader. It
// is the gateway's /metrics: a few gauges, counters and the HTTP histograms,
// without linking the Prometheus client into the gateway (taskrunnerd, which
// owns the rest of the metrics, uses the Prometheus exporter). Names follow
// the exporter's rules: dots become underscores, monotonic sums end in
// _total, seconds and bytes units add _seconds / _bytes.
type MetricsPage struct{ reader *sdkmetric.ManualReader }

// NewMetricsPage returns a page; pass Reader() to Setup with WithMetricReader.
func NewMetricsPage() *MetricsPage { return &MetricsPage{reader: sdkmetric.NewManualReader()} }

// Reader is the SDK reader the meter provider must feed.
func (p *MetricsPage) Reader() sdkmetric.Reader { return p.reader }

func (p *MetricsPage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(r.Context(), &rm); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	bw := bufio.NewWriter(w)
	writeMetrics(bw, rm)
	_ = bw.Flush()
}

// text is what ServeHTTP writes, for tests.
func (p *MetricsPage) text(ctx context.Context) (string, error) {
	var rm metricdata.ResourceMetrics
	if err := p.reader.Collect(ctx, &rm); err != nil {
		return "", err
	}
	var b strings.Builder
	bw := bufio.NewWriter(&b)
	writeMetrics(bw, rm)
	_ = bw.Flush()
	return b.String(), nil
}

func writeMetrics(w *bufio.Writer, rm metricdata.ResourceMetrics) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			writeMetric(w, m)
		}
	}
}

func writeMetric(w *bufio.Writer, m metricdata.Metrics) {
	name := promName(m.Name, m.Unit)
	switch d := m.Data.(type) {
	case metricdata.Gauge[int64]:
		header(w, name, m.Description, "gauge")
		points(w, name, d.DataPoints)
	case metricdata.Gauge[float64]:
		header(w, name, m.Description, "gauge")
		points(w, name, d.DataPoints)
	case metricdata.Sum[int64]:
		name, kind := sumName(name, d.IsMonotonic)
		header(w, name, m.Description, kind)
		points(w, name, d.DataPoints)
	case metricdata.Sum[float64]:
		name, kind := sumName(name, d.IsMonotonic)
		header(w, name, m.Description, kind)
		points(w, name, d.DataPoints)
	case metricdata.Histogram[int64]:
		header(w, name, m.Description, "histogram")
		histogram(w, name, d.DataPoints)
	case metricdata.Histogram[float64]:
		header(w, name, m.Description, "histogram")
		histogram(w, name, d.DataPoints)
	}
}

func sumName(name string, monotonic bool) (string, string) {
	if monotonic {
		return strings.TrimSuffix(name, "_total") + "_total", "counter"
	}
	return name, "gauge"
}

func header(w *bufio.Writer, name, help, kind string) {
	if help != "" {
		fmt.Fprintf(w, "# HELP %s %s\n", name, strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(help))
	}
	fmt.Fprintf(w, "# TYPE %s %s\n", name, kind)
}

func points[N int64 | float64](w *bufio.Writer, name string, dps []metricdata.DataPoint[N]) {
	for _, dp := range dps {
		fmt.Fprintf(w, "%s%s %s\n", name, labels(dp.Attributes, ""), number(float64(dp.Value)))
	}
}

func histogram[N int64 | float64](w *bufio.Writer, name string, dps []metricdata.HistogramDataPoint[N]) {
	for _, dp := range dps {
		var cum uint64
		for i, b := range dp.Bounds {
			cum += dp.BucketCounts[i]
			fmt.Fprintf(w, "%s_bucket%s %d\n", name, labels(dp.Attributes, number(b)), cum)
		}
		fmt.Fprintf(w, "%s_bucket%s %d\n", name, labels(dp.Attributes, "+Inf"), dp.Count)
		fmt.Fprintf(w, "%s_sum%s %s\n", name, labels(dp.Attributes, ""), number(float64(dp.Sum)))
		fmt.Fprintf(w, "%s_count%s %d\n", name, labels(dp.Attributes, ""), dp.Count)
	}
}

// labels renders a set of attributes (plus le for a histogram bucket).
func labels(set attribute.Set, le string) string {
	var parts []string
	for _, kv := range set.ToSlice() {
		parts = append(parts, promIdent(string(kv.Key))+"="+strconv.Quote(kv.Value.Emit()))
	}
	slices.Sort(parts)
	if le != "" {
		parts = append(parts, `le="`+le+`"`)
	}
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func number(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// promName is the metric's Prometheus name: invalid characters become
// underscores, and the unit adds its suffix once.
func promName(name, unit string) string {
	n := promIdent(name)
	suffix := map[string]string{"s": "_seconds", "ms": "_milliseconds", "By": "_bytes"}[unit]
	if suffix != "" && !strings.HasSuffix(n, suffix) {
		n += suffix
	}
	return n
}

func promIdent(s string) string {
	b := []byte(s)
	for i, c := range b {
		ok := c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
		if !ok {
			b[i] = '_'
		}
	}
	return string(b)
}
