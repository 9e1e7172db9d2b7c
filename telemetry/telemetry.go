// Package telemetry exports what farmem's fault path does as OpenTelemetry traces and metrics:
// a span per sampled page fault with its stages as child spans, spans per eviction batch and
// per prefetch batch linked to the fault behind them, and metrics (fault duration histogram and
// counts by source, evictions, prefetches, bytes moved, resident bytes, backend health) over
// OTLP (http/protobuf or gRPC), to stdout, and as a Prometheus scrape endpoint. What is
// exported, and how, is the flags' and the standard OTEL_* variables' (config.go).
//
// Why a package of its own: the fault path is the hot path, and OpenTelemetry is neither cheap
// nor small. Package fetcher sees only fetcher.Tracer (two methods taking plain structs) and
// keeps its own counters and histograms, as it did before; it never calls into the SDK. The
// fault thread takes nanotime stamps into a fixed struct it owns and, only for a fault the head
// sampler picked or one slower than --trace-slow, copies them into a channel after the fault
// is served and its thread woken. This package builds the spans afterwards on its own goroutine,
// back-dated with trace.WithTimestamp. A head-sampled fault is picked when it begins and given
// its trace id and its backend fetch's span id then; its read to a memory server carries them
// (fabric's traced requests), and its spans here are made with exactly those ids
// (presetIDGenerator), so the memory server's span of the read (StartServer) joins the fault's
// trace as the fetch's child. Metrics are all asynchronous: callbacks and a
// metric.Producer read the counters and histograms the fault path keeps anyway, at collection
// time, so a fault does no work at all for them.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/runtime"
)

// Telemetry is one run's exporters. Attach it to the runtime, Shutdown it at the end.
type Telemetry struct {
	once   sync.Once
	cfg    Config
	warn   func(string)
	tp     *sdktrace.TracerProvider
	mp     *sdkmetric.MeterProvider
	prom   *http.Server
	spans  *spanWorker
	source *source
	// tracing is the faults' tracing handed out by Tracing (nil: traces off); its slow budget
	// counts what was not traced.
	tracing *fetcher.Tracing
}

// Start makes the exporters and, with MetricsAddr, starts serving /metrics. warn prints one
// line; it is called once, for the first export error (an unreachable endpoint does not stop
// the program).
func Start(ctx context.Context, cfg Config, warn func(string)) (*Telemetry, error) {
	t := &Telemetry{cfg: cfg, warn: warn, source: &source{start: time.Now()}}
	if !cfg.Enabled() {
		return t, nil
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(t.warnOnce))
	res, err := newResource(ctx, "farmem", attribute.String("farmem.program", cfg.Program))
	if err != nil {
		return nil, err
	}
	if cfg.Tracing() {
		// Every span is made only for a record the fault path already sampled: no second draw.
		t.tp, err = newTracerProvider(ctx, &cfg, res, sdktrace.AlwaysSample())
		if err != nil {
			return nil, err
		}
		t.spans = newSpanWorker(t.tp.Tracer("github.com/farmem/farmem/telemetry"), cfg)
	}
	if err := t.startMetrics(ctx, res); err != nil {
		t.Shutdown(ctx)
		return nil, err
	}
	return t, nil
}

func (t *Telemetry) startMetrics(ctx context.Context, res *resource.Resource) error {
	c := &t.cfg
	if !c.metricsReader() && c.MetricsAddr == "" {
		return nil
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	readers, err := metricReaders(ctx, c, t.source)
	if err != nil {
		return err
	}
	for _, r := range readers {
		opts = append(opts, sdkmetric.WithReader(r))
	}
	if c.MetricsAddr != "" {
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithProducer(t.source))
		if err != nil {
			return err
		}
		opts = append(opts, sdkmetric.WithReader(exp))
		ln, err := net.Listen("tcp", c.MetricsAddr)
		if err != nil {
			return fmt.Errorf("%s: %w", c.metricsAddrFrom, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.prom = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go t.prom.Serve(ln)
	}
	t.mp = sdkmetric.NewMeterProvider(opts...)
	return t.source.register(t.mp.Meter("github.com/farmem/farmem/telemetry"))
}

// warnOnce reports the first export error (an unreachable endpoint, a refusing collector):
// telemetry never stops the program, and one line says it is not getting through, with the
// likely cause if the configuration suggests one.
func (t *Telemetry) warnOnce(err error) {
	t.once.Do(func() {
		t.warn(fmt.Sprintf("telemetry: %v%s (the program runs on; further telemetry errors are not shown)", err, t.cfg.hint()))
	})
}

// Tracing returns the tracing of a run's faults and prefetch batches, and the tracer of its
// eviction batches, for runtime.Config; nil and nil when traces are off. b is the run's backend:
// a traced fault read from memory servers names the copy that answered.
func (t *Telemetry) Tracing(b backend.Backend) (*fetcher.Tracing, func(*evictor.BatchRecord)) {
	if t.spans == nil {
		return nil, nil
	}
	t.tracing = &fetcher.Tracing{Tracer: t.spans, Sample: fetcher.SampleThreshold(t.cfg.Sample), Slow: t.cfg.Slow,
		Budget: fetcher.SlowBudget{PerSecond: t.cfg.SlowMax}}
	t.spans.describe, _ = b.(fetcher.LoadDescriber)
	return t.tracing, t.spans.evicted
}

// Observe makes rt's counters the metrics' source. Call it before the first process attaches.
func (t *Telemetry) Observe(rt *runtime.Runtime) { t.source.attach(rt) }

// Dropped is how many sampled records were not made into spans because the span goroutine was
// behind (the fault path never waits for it).
func (t *Telemetry) Dropped() int64 {
	if t.spans == nil {
		return 0
	}
	return t.spans.dropped.Load()
}

// SlowSkipped is how many faults slower than --trace-slow were not traced because
// --trace-slow-max of them had been that second.
func (t *Telemetry) SlowSkipped() int64 {
	if t.tracing == nil {
		return 0
	}
	return t.tracing.Budget.Skipped()
}

// Shutdown makes the last spans, flushes every exporter (the metrics' last collection is the
// run's final counts) and stops /metrics. It gives up after ctx's deadline: an unreachable
// endpoint must not hold up farmem's exit for long.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	if t.spans != nil {
		t.spans.flush()
	}
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	if t.prom != nil {
		t.prom.Close()
	}
	err := errors.Join(errs...)
	if err != nil {
		t.warnOnce(err)
	}
	return err
}
