// Package telemetry exports what farmem's fault path does as OpenTelemetry traces and metrics:
// a span per sampled page fault with its stages as child spans, spans per eviction batch and
// per prefetch batch linked to the fault behind them, and metrics (fault latency histogram and
// counts by source, evictions, prefetches, bytes, resident pages, backend health) over OTLP
// (gRPC or HTTP) and as a Prometheus scrape endpoint.
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
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/runtime"
)

// Protocols are the OTLP protocols farmem speaks.
const (
	ProtoGRPC = "grpc"
	ProtoHTTP = "http/protobuf"
)

// Defaults of the run flags.
const (
	DefaultSample = 0.01
	DefaultSlow   = 100 * time.Microsecond
	// DefaultSlowMax bounds the faults traced for being slow to 100 a second: enough to see
	// every kind of slow fault a run has, few enough that an overloaded machine, where most
	// faults are slow, is not loaded further by tracing them all (results/telemetry.md).
	DefaultSlowMax = 100
)

// Config is what the run flags and the OTEL_* environment ask for. Flags override the
// environment; Resolve fills in the rest.
type Config struct {
	// Endpoint is --otlp: HOST:PORT (plaintext, for a collector on the host or a trusted
	// network) or a URL (http:// or https://). Empty: OTEL_EXPORTER_OTLP_ENDPOINT (or
	// _TRACES_ENDPOINT / _METRICS_ENDPOINT), which the exporters read themselves.
	Endpoint string
	// Protocol is --otlp-protocol; empty: OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL, else http/protobuf
	// for an endpoint on port 4318 (OTLP/HTTP's port), else grpc.
	Protocol string
	Sample   float64       // head sampling ratio of faults, 0..1
	Slow     time.Duration // faults (and prefetch batches) slower than this are traced; 0: none
	SlowMax  int64         // but at most this many a second (the rest are counted); 0: no bound
	Stdout   bool          // also write spans to stdout, pretty-printed (debugging)
	// MetricsAddr is --metrics-addr: HOST:PORT to serve Prometheus's /metrics on.
	MetricsAddr string
	Program     string // the program's name, a resource attribute

	traces, metrics bool // resolved: export traces / metrics over OTLP
}

// Env is the environment Resolve reads (os.Getenv in farmem; a map in tests).
type Env func(string) string

// Resolve validates c and decides, from c and the environment, what is exported. An error is
// the user's: a bad protocol name, ratio or endpoint.
func (c *Config) Resolve(env Env) error {
	if c.Sample < 0 || c.Sample > 1 || c.Sample != c.Sample {
		return fmt.Errorf("--trace-sample %v: give a ratio from 0 to 1 (0.01: one fault in a hundred)", c.Sample)
	}
	if c.SlowMax < 0 {
		return fmt.Errorf("--trace-slow-max %d: give a number of faults a second, 0 or more (0: no bound)", c.SlowMax)
	}
	if c.Slow < 0 {
		return fmt.Errorf("--trace-slow %v: give a duration of 0 or more (0: keep no fault for being slow)", c.Slow)
	}
	if strings.EqualFold(env("OTEL_SDK_DISABLED"), "true") && c.Endpoint == "" {
		return nil
	}
	tracesEnv := env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	metricsEnv := env("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") != ""
	c.traces = c.Endpoint != "" || tracesEnv
	c.metrics = c.Endpoint != "" || metricsEnv
	if c.Endpoint != "" {
		if _, _, err := splitEndpoint(c.Endpoint); err != nil {
			return fmt.Errorf("--otlp %q: %v", c.Endpoint, err)
		}
	}
	if c.Protocol == "" {
		c.Protocol = firstOf(env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), env("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	if c.Protocol == "" {
		c.Protocol = ProtoGRPC
		ep := firstOf(c.Endpoint, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), env("OTEL_EXPORTER_OTLP_ENDPOINT"))
		if strings.HasSuffix(strings.TrimRight(strings.SplitN(strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://"), "/", 2)[0], "/"), ":4318") {
			c.Protocol = ProtoHTTP
		}
	}
	if c.Protocol != ProtoGRPC && c.Protocol != ProtoHTTP {
		return fmt.Errorf("OTLP protocol %q: give grpc or http/protobuf", c.Protocol)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr %q: give HOST:PORT (e.g. 127.0.0.1:9464): %v", c.MetricsAddr, err)
		}
	}
	return nil
}

// Tracing reports whether spans are made at all (an OTLP endpoint or --trace-stdout).
func (c *Config) Tracing() bool { return c.traces || c.Stdout }

// Enabled reports whether anything is exported.
func (c *Config) Enabled() bool { return c.Tracing() || c.metrics || c.MetricsAddr != "" }

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// splitEndpoint turns --otlp's value into a host:port and whether it is plaintext.
func splitEndpoint(ep string) (hostport string, insecure bool, err error) {
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return "", false, err
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return "", false, fmt.Errorf("scheme %q: give HOST:PORT, http://HOST:PORT or https://HOST:PORT", u.Scheme)
		}
		ep, insecure = u.Host, u.Scheme == "http"
	} else {
		insecure = true
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return "", false, fmt.Errorf("give HOST:PORT (e.g. 127.0.0.1:4317): %v", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", false, fmt.Errorf("port %q is not a port number", port)
	}
	return net.JoinHostPort(host, port), insecure, nil
}

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

// newResource describes this process: service.name (OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override it), its pid and attrs.
func newResource(ctx context.Context, service string, attrs ...attribute.KeyValue) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)), // OTEL_SERVICE_NAME overrides it
		resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(append(attrs, attribute.Int("farmem.pid", os.Getpid()))...))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return res, nil
}

// newTracerProvider exports spans over OTLP (and to stdout with cfg.Stdout) in batches; span ids
// come from presetIDGenerator.
func newTracerProvider(ctx context.Context, cfg *Config, res *resource.Resource, sampler sdktrace.Sampler) (*sdktrace.TracerProvider, error) {
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sampler),
		sdktrace.WithIDGenerator(presetIDGenerator{})}
	bsp := []sdktrace.BatchSpanProcessorOption{sdktrace.WithMaxQueueSize(16384), sdktrace.WithBatchTimeout(time.Second),
		sdktrace.WithMaxExportBatchSize(1024)}
	if cfg.traces {
		exp, err := traceExporter(ctx, cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp, bsp...))
	}
	if cfg.Stdout {
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stdout), stdouttrace.WithPrettyPrint())
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp, bsp...))
	}
	return sdktrace.NewTracerProvider(opts...), nil
}

// An export gives up after a few seconds (the SDK's default retries for a minute): a collector
// that is down costs the run some dropped spans, not a minute of blocked exports and exit.
const exportTimeout = 3 * time.Second

var retry = otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, MaxElapsedTime: 3 * time.Second}

func traceExporter(ctx context.Context, c *Config) (sdktrace.SpanExporter, error) {
	// Without --otlp the exporters read OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT and _HEADERS
	// themselves; --otlp overrides the endpoint only.
	var hostport string
	var insecure bool
	if c.Endpoint != "" {
		hostport, insecure, _ = splitEndpoint(c.Endpoint) // checked by Resolve
	}
	if c.Protocol == ProtoHTTP {
		var o []otlptracehttp.Option
		if hostport != "" {
			o = append(o, otlptracehttp.WithEndpoint(hostport))
			if insecure {
				o = append(o, otlptracehttp.WithInsecure())
			}
		}
		o = append(o, otlptracehttp.WithTimeout(exportTimeout), otlptracehttp.WithRetry(otlptracehttp.RetryConfig(retry)))
		return otlptracehttp.New(ctx, o...)
	}
	var o []otlptracegrpc.Option
	if hostport != "" {
		o = append(o, otlptracegrpc.WithEndpoint(hostport))
		if insecure {
			o = append(o, otlptracegrpc.WithInsecure())
		}
	}
	o = append(o, otlptracegrpc.WithTimeout(exportTimeout), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig(retry)))
	return otlptracegrpc.New(ctx, o...)
}

func metricExporter(ctx context.Context, c *Config) (sdkmetric.Exporter, error) {
	var hostport string
	var insecure bool
	if c.Endpoint != "" {
		hostport, insecure, _ = splitEndpoint(c.Endpoint)
	}
	if c.Protocol == ProtoHTTP {
		var o []otlpmetrichttp.Option
		if hostport != "" {
			o = append(o, otlpmetrichttp.WithEndpoint(hostport))
			if insecure {
				o = append(o, otlpmetrichttp.WithInsecure())
			}
		}
		o = append(o, otlpmetrichttp.WithTimeout(exportTimeout), otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig(retry)))
		return otlpmetrichttp.New(ctx, o...)
	}
	var o []otlpmetricgrpc.Option
	if hostport != "" {
		o = append(o, otlpmetricgrpc.WithEndpoint(hostport))
		if insecure {
			o = append(o, otlpmetricgrpc.WithInsecure())
		}
	}
	o = append(o, otlpmetricgrpc.WithTimeout(exportTimeout), otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig(retry)))
	return otlpmetricgrpc.New(ctx, o...)
}

func (t *Telemetry) startMetrics(ctx context.Context, res *resource.Resource) error {
	c := &t.cfg
	if !c.metrics && c.MetricsAddr == "" {
		return nil
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	if c.metrics {
		exp, err := metricExporter(ctx, c)
		if err != nil {
			return err
		}
		var ro []sdkmetric.PeriodicReaderOption
		ro = append(ro, sdkmetric.WithProducer(t.source))
		if os.Getenv("OTEL_METRIC_EXPORT_INTERVAL") == "" {
			ro = append(ro, sdkmetric.WithInterval(10*time.Second))
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, ro...)))
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
			return fmt.Errorf("--metrics-addr %s: %w", c.MetricsAddr, err)
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
// telemetry never stops the program, and one line says it is not getting through.
func (t *Telemetry) warnOnce(err error) {
	t.once.Do(func() {
		t.warn(fmt.Sprintf("telemetry: %v (the program runs on; further telemetry errors are not shown)", err))
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
