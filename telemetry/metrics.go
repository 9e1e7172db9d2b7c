package telemetry

import (
	"context"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/runtime"
)

// latencyBounds are the fault-latency histogram's bucket bounds: from a round trip on one CPU
// (microseconds) through one across CPUs and a memory server's read (tens to a hundred) to the
// faults that waited (milliseconds); docs/DESIGN.md, "Latency".
var latencyBounds = []time.Duration{
	1 * time.Microsecond, 2 * time.Microsecond, 5 * time.Microsecond, 10 * time.Microsecond,
	20 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond, 200 * time.Microsecond,
	500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, time.Second,
}

// source reads the run's counters for the metrics. It is a metric.Producer for the latency
// histogram (the SDK has no asynchronous histogram, and a synchronous one would cost every
// fault an SDK call: the fault path's own histograms are converted at collection instead) and
// registers observable counters and gauges for the rest.
type source struct {
	start time.Time
	rt    atomic.Pointer[runtime.Runtime]
}

func (s *source) attach(rt *runtime.Runtime) { s.rt.Store(rt) }

var srcAttrs = func() (a [fetcher.NumSources]metric.MeasurementOption) {
	for i := range a {
		a[i] = metric.WithAttributes(attribute.String("source", sourceName[i]))
	}
	return a
}()

var srcSets = func() (a [fetcher.NumSources]attribute.Set) {
	for i := range a {
		a[i] = attribute.NewSet(attribute.String("source", sourceName[i]))
	}
	return a
}()

// Produce implements sdkmetric.Producer: farmem.fault.latency, cumulative, by source.
func (s *source) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	rt := s.rt.Load()
	if rt == nil {
		return nil, nil
	}
	bounds := make([]float64, len(latencyBounds))
	for i, b := range latencyBounds {
		bounds[i] = b.Seconds()
	}
	now := time.Now()
	var snap latency.Snapshot
	var points []metricdata.HistogramDataPoint[float64]
	for src := fetcher.Source(0); src < fetcher.NumSources; src++ {
		rt.Stats.Latency[src].Snapshot(&snap)
		counts := make([]uint64, len(latencyBounds)+1)
		snap.Cumulate(latencyBounds, counts)
		points = append(points, metricdata.HistogramDataPoint[float64]{
			Attributes: srcSets[src], StartTime: s.start, Time: now,
			Count: snap.N, Sum: time.Duration(snap.Sum).Seconds(), Bounds: bounds, BucketCounts: counts,
		})
	}
	return []metricdata.ScopeMetrics{{
		Scope: instrumentation.Scope{Name: "github.com/farmem/farmem/telemetry"},
		Metrics: []metricdata.Metrics{{
			Name:        "farmem.fault.latency",
			Description: "page-fault service time, from reading the fault message to the install (or wake) ioctl's return, by source",
			Unit:        "s",
			Data:        metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: points},
		}},
	}}, nil
}

// register makes the observable instruments; their callback reads the counters at collection.
func (s *source) register(m metric.Meter) error {
	faults, err := m.Int64ObservableCounter("farmem.faults", metric.WithUnit("{fault}"),
		metric.WithDescription("page faults served, by source (zero fill, backend, write-protect, prefetch cache)"))
	if err != nil {
		return err
	}
	evictions, err := m.Int64ObservableCounter("farmem.evictions", metric.WithUnit("{page}"),
		metric.WithDescription("pages evicted, by outcome: written to the backend, dropped clean (its copy was current), zero (stored as nothing)"))
	if err != nil {
		return err
	}
	batches, err := m.Int64ObservableCounter("farmem.eviction.batches", metric.WithUnit("{batch}"), metric.WithDescription("eviction batches"))
	if err != nil {
		return err
	}
	prefetches, err := m.Int64ObservableCounter("farmem.prefetches", metric.WithUnit("{page}"),
		metric.WithDescription("prefetched pages by stage: issued (predicted and queued), placed (installed or cached), used (the program touched them)"))
	if err != nil {
		return err
	}
	bytes, err := m.Int64ObservableCounter("farmem.backend.io", metric.WithUnit("By"),
		metric.WithDescription("page bytes read from the backend (in: faults and prefetches) and written to it (out: evictions)"))
	if err != nil {
		return err
	}
	resident, err := m.Int64ObservableGauge("farmem.resident.pages", metric.WithUnit("{page}"),
		metric.WithDescription("pages resident in the program's registered memory, as farmem's page tables count them"))
	if err != nil {
		return err
	}
	capPages, err := m.Int64ObservableGauge("farmem.cap.pages", metric.WithUnit("{page}"), metric.WithDescription("the local-memory cap (--local-mem)"))
	if err != nil {
		return err
	}
	stored, err := m.Int64ObservableGauge("farmem.backend.stored.pages", metric.WithUnit("{page}"), metric.WithDescription("pages held in the backend"))
	if err != nil {
		return err
	}
	health, err := m.Int64ObservableGauge("farmem.backend.servers", metric.WithUnit("{server}"),
		metric.WithDescription("backend servers by state (up, down); the embedded store counts as one server, always up"))
	if err != nil {
		return err
	}
	var (
		written  = metric.WithAttributes(attribute.String("outcome", "written"))
		dropped  = metric.WithAttributes(attribute.String("outcome", "clean_dropped"))
		zero     = metric.WithAttributes(attribute.String("outcome", "zero"))
		issued   = metric.WithAttributes(attribute.String("stage", "issued"))
		placed   = metric.WithAttributes(attribute.String("stage", "placed"))
		used     = metric.WithAttributes(attribute.String("stage", "used"))
		in       = metric.WithAttributes(attribute.String("direction", "in"))
		out      = metric.WithAttributes(attribute.String("direction", "out"))
		up, down = metric.WithAttributes(attribute.String("state", "up")), metric.WithAttributes(attribute.String("state", "down"))
	)
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		rt := s.rt.Load()
		if rt == nil {
			return nil
		}
		st, es := &rt.Stats, &rt.Evictor().Stats
		for src := fetcher.Source(0); src < fetcher.NumSources; src++ {
			o.ObserveInt64(faults, int64(st.Latency[src].Count()), srcAttrs[src])
		}
		o.ObserveInt64(evictions, es.Written.Load(), written)
		o.ObserveInt64(evictions, es.Dropped.Load(), dropped)
		o.ObserveInt64(evictions, es.Zero.Load(), zero)
		o.ObserveInt64(batches, es.Batches.Load())
		o.ObserveInt64(prefetches, st.PrefetchIssued.Load(), issued)
		o.ObserveInt64(prefetches, st.PrefetchInstalled.Load(), placed)
		o.ObserveInt64(prefetches, st.PrefetchUsed.Load(), used)
		o.ObserveInt64(bytes, rt.BytesIn(), in)
		o.ObserveInt64(bytes, rt.BytesOut(), out)
		o.ObserveInt64(resident, rt.Resident())
		o.ObserveInt64(capPages, rt.Config().CapPages)
		b := rt.Config().Backend
		o.ObserveInt64(stored, int64(b.Stored()))
		u, n := 1, 1
		if h, ok := b.(interface{ Health() (up, total int) }); ok {
			u, n = h.Health()
		}
		o.ObserveInt64(health, int64(u), up)
		o.ObserveInt64(health, int64(n-u), down)
		return nil
	}, faults, evictions, batches, prefetches, bytes, resident, capPages, stored, health)
	return err
}
