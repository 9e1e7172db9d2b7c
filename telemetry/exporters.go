package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// newResource describes this process: service.name (OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES override it), process.pid (farmem's own: the program's pid is on
// its spans) and attrs.
func newResource(ctx context.Context, service string, attrs ...attribute.KeyValue) (*resource.Resource, error) {
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)), // OTEL_SERVICE_NAME overrides it
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithProcessPID(),
		resource.WithAttributes(attrs...))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	return res, nil
}

// newTracerProvider exports spans over OTLP and to stdout, as cfg says, in batches; span ids
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
	if cfg.Stdout || cfg.tracesConsole {
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

// flagEndpoint is --otlp as host:port and whether it is plaintext; "" without the flag, when
// the exporters read OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)ENDPOINT themselves. The exporters
// read _HEADERS, _CERTIFICATE and the rest themselves either way.
func flagEndpoint(c *Config) (hostport string, insecure bool) {
	if c.Endpoint != "" {
		hostport, insecure, _ = splitEndpoint(c.Endpoint) // checked by Resolve
	}
	return hostport, insecure
}

func traceExporter(ctx context.Context, c *Config) (sdktrace.SpanExporter, error) {
	hostport, insecure := flagEndpoint(c)
	if c.tracesProto == ProtoHTTP {
		var o []otlptracehttp.Option
		if hostport != "" {
			// The whole URL: a path from OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must not survive --otlp.
			o = append(o, otlptracehttp.WithEndpoint(hostport), otlptracehttp.WithURLPath("/v1/traces"))
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
	hostport, insecure := flagEndpoint(c)
	if c.metricsProto == ProtoHTTP {
		var o []otlpmetrichttp.Option
		if hostport != "" {
			o = append(o, otlpmetrichttp.WithEndpoint(hostport), otlpmetrichttp.WithURLPath("/v1/metrics"))
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

// metricReaders are the periodic readers that push metrics (OTLP, stdout), each also reading
// producer (the fault-duration histogram). Every 10 s unless OTEL_METRIC_EXPORT_INTERVAL says
// otherwise (the SDK reads it): the SDK's minute is too coarse for a run that may last seconds.
func metricReaders(ctx context.Context, c *Config, producer sdkmetric.Producer) ([]sdkmetric.Reader, error) {
	ro := []sdkmetric.PeriodicReaderOption{sdkmetric.WithProducer(producer)}
	if c.metricInterval == "" {
		ro = append(ro, sdkmetric.WithInterval(10*time.Second))
	}
	var readers []sdkmetric.Reader
	if c.metrics {
		exp, err := metricExporter(ctx, c)
		if err != nil {
			return nil, err
		}
		readers = append(readers, sdkmetric.NewPeriodicReader(exp, ro...))
	}
	if c.metricsConsole {
		exp, err := stdoutmetric.New(stdoutmetric.WithWriter(os.Stdout), stdoutmetric.WithPrettyPrint())
		if err != nil {
			return nil, err
		}
		readers = append(readers, sdkmetric.NewPeriodicReader(exp, ro...))
	}
	return readers, nil
}
