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

// latencyBounds are the fault-duration histogram's bucket bounds: from a round trip on one CPU
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
		a[i] = metric.WithAttributes(attribute.String(attrFaultSource, sourceName[i]))
	}
	return a
}()

var srcSets = func() (a [fetcher.NumSources]attribute.Set) {
	for i := range a {
		a[i] = attribute.NewSet(attribute.String(attrFaultSource, sourceName[i]))
	}
	return a
}()

// Produce implements sdkmetric.Producer: farmem.fault.duration, cumulative, by source.
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
			Name:        "farmem.fault.duration",
			Description: "page-fault service time, from reading the fault message to the install (or wake) ioctl's return, by source",
			Unit:        "s",
			Data:        metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: points},
		}},
	}}, nil
}

// register makes the observable instruments; their callback reads the counters at collection.
// Names follow OpenTelemetry's semantic conventions: a count of things is plural with the
// thing as its unit ({fault}), an amount of memory is in bytes ("By": Prometheus names it
// farmem_resident_bytes), a limit is NAME.limit, a flow both ways is NAME.io with a direction,
// and every attribute is in farmem's namespace, named as the spans name it.
func (s *source) register(m metric.Meter) error {
	faults, err := m.Int64ObservableCounter("farmem.faults", metric.WithUnit("{fault}"),
		metric.WithDescription("page faults served, by source (zero fill, backend, write-protect, prefetch cache)"))
	if err != nil {
		return err
	}
	evictions, err := m.Int64ObservableCounter("farmem.eviction.pages", metric.WithUnit("{page}"),
		metric.WithDescription("pages evicted, by outcome: written to the backend, clean_dropped (its copy was current), zero (stored as nothing)"))
	if err != nil {
		return err
	}
	batches, err := m.Int64ObservableCounter("farmem.eviction.batches", metric.WithUnit("{batch}"), metric.WithDescription("eviction batches"))
	if err != nil {
		return err
	}
	prefetches, err := m.Int64ObservableCounter("farmem.prefetch.pages", metric.WithUnit("{page}"),
		metric.WithDescription("prefetched pages by stage: issued (predicted and queued), placed (installed or cached), used (the program touched them)"))
	if err != nil {
		return err
	}
	io, err := m.Int64ObservableCounter("farmem.backend.io", metric.WithUnit("By"),
		metric.WithDescription("page bytes read from the backend (faults and prefetches) and written to it (evictions), by direction"))
	if err != nil {
		return err
	}
	resident, err := m.Int64ObservableGauge("farmem.resident", metric.WithUnit("By"),
		metric.WithDescription("memory resident in the program's registered ranges, as farmem's page tables count it"))
	if err != nil {
		return err
	}
	limit, err := m.Int64ObservableGauge("farmem.resident.limit", metric.WithUnit("By"), metric.WithDescription("the cap on resident memory (--local-mem)"))
	if err != nil {
		return err
	}
	stored, err := m.Int64ObservableGauge("farmem.backend.stored", metric.WithUnit("By"),
		metric.WithDescription("memory the backend holds for the evicted pages (less than their size with --compress; one copy of each)"))
	if err != nil {
		return err
	}
	servers, err := m.Int64ObservableGauge("farmem.backend.server.count", metric.WithUnit("{server}"),
		metric.WithDescription("backend servers by state (up, down); the embedded store counts as one server, always up"))
	if err != nil {
		return err
	}
	var (
		written  = metric.WithAttributes(attribute.String(attrEvictionOutcome, "written"))
		dropped  = metric.WithAttributes(attribute.String(attrEvictionOutcome, "clean_dropped"))
		zero     = metric.WithAttributes(attribute.String(attrEvictionOutcome, "zero"))
		issued   = metric.WithAttributes(attribute.String(attrPrefetchStage, "issued"))
		placed   = metric.WithAttributes(attribute.String(attrPrefetchStage, "placed"))
		used     = metric.WithAttributes(attribute.String(attrPrefetchStage, "used"))
		read     = metric.WithAttributes(attribute.String(attrIODirection, "read"))
		write    = metric.WithAttributes(attribute.String(attrIODirection, "write"))
		up, down = metric.WithAttributes(attribute.String(attrServerState, "up")), metric.WithAttributes(attribute.String(attrServerState, "down"))
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
		o.ObserveInt64(io, rt.BytesIn(), read)
		o.ObserveInt64(io, rt.BytesOut(), write)
		o.ObserveInt64(resident, rt.Resident()*runtime.PageSize)
		o.ObserveInt64(limit, rt.Config().CapPages*runtime.PageSize)
		b := rt.Config().Backend
		o.ObserveInt64(stored, b.StoredBytes())
		u, n := 1, 1
		if h, ok := b.(interface{ Health() (up, total int) }); ok {
			u, n = h.Health()
		}
		o.ObserveInt64(servers, int64(u), up)
		o.ObserveInt64(servers, int64(n-u), down)
		return nil
	}, faults, evictions, batches, prefetches, io, resident, limit, stored, servers)
	return err
}
