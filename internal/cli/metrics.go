package cli

import (
	"bytes"
	"fmt"
	"sort"
	"strconv"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/api"
)

func newMetricsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "metrics NAME",
		Short: "Print the Prometheus metrics of an instance's running filters",
		Long: `Print the Prometheus metrics of an instance's running filters, in the text
exposition format a scraper reads (docs/metrics.md), or with --json as a list
of metric families. A scraper on this host can read the same from the
daemon's loopback listener when the instance has one (create --metrics-listen).`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			text, err := c.Metrics(cmd.Context())
			if err != nil {
				return err
			}
			if !asJSON {
				_, err := e.stdout.Write(text)
				return err
			}
			fams, err := metricFamilies(text)
			if err != nil {
				return fmt.Errorf("instance %s: reading its metrics: %w", name, err)
			}
			return writeJSON(e.stdout, fams)
		}),
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

// metricFamily is one family of `abox metrics --json`.
type metricFamily struct {
	Name    string         `json:"name"`
	Type    string         `json:"type"`
	Help    string         `json:"help,omitempty"`
	Samples []metricSample `json:"samples"`
}

// metricSample is one series: Value for a counter or gauge; Count, Sum and
// Buckets (upper bound in seconds, as the text has it, to cumulative
// count) for a histogram.
type metricSample struct {
	Labels  map[string]string `json:"labels"`
	Value   *float64          `json:"value,omitempty"`
	Count   *uint64           `json:"count,omitempty"`
	Sum     *float64          `json:"sum,omitempty"`
	Buckets map[string]uint64 `json:"buckets,omitempty"`
}

// metricFamilies parses the text exposition into families sorted by name.
func metricFamilies(text []byte) ([]metricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	m, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, err
	}
	out := make([]metricFamily, 0, len(m))
	for _, f := range m {
		fam := metricFamily{Name: f.GetName(), Type: f.GetType().String(), Help: f.GetHelp(), Samples: []metricSample{}}
		for _, mt := range f.GetMetric() {
			s := metricSample{Labels: map[string]string{}}
			for _, lp := range mt.GetLabel() {
				s.Labels[lp.GetName()] = lp.GetValue()
			}
			switch {
			case mt.Counter != nil:
				v := mt.Counter.GetValue()
				s.Value = &v
			case mt.Gauge != nil:
				v := mt.Gauge.GetValue()
				s.Value = &v
			case mt.Untyped != nil:
				v := mt.Untyped.GetValue()
				s.Value = &v
			case mt.Histogram != nil:
				h := mt.Histogram
				n, sum := h.GetSampleCount(), h.GetSampleSum()
				s.Count, s.Sum, s.Buckets = &n, &sum, map[string]uint64{}
				for _, b := range h.GetBucket() {
					s.Buckets[strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)] = b.GetCumulativeCount()
				}
			}
			fam.Samples = append(fam.Samples, s)
		}
		out = append(out, fam)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
