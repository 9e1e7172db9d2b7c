package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/telemetry"
)

// telemetryFlags are farmem run's observability settings: OpenTelemetry traces and metrics,
// the Prometheus endpoint and the live stats line.
func telemetryFlags() []cli.Flag {
	return append(otlpFlags("fault traces and metrics"), []cli.Flag{
		&cli.StringFlag{Name: "trace-sample", Value: strconv.FormatFloat(telemetry.DefaultSample, 'g', -1, 64), Usage: "with an OTLP endpoint or --trace-stdout: the share of faults traced, 0 to 1 (head sampling;\n\tan unsampled fast fault costs nothing more than a few clock reads); default: as OTEL_TRACES_SAMPLER\n\tsays, else 0.001"},
		&cli.StringFlag{Name: "trace-slow", Value: telemetry.DefaultSlow.String(), Usage: "trace every fault slower than DURATION, sampled or not (0: none)"},
		&cli.Int64Flag{Name: "trace-slow-max", Value: telemetry.DefaultSlowMax, Usage: "but at most N a second: past that, slow faults are counted, not traced (0: no bound)"},
		&cli.BoolFlag{Name: "trace-stdout", Usage: "also print the spans on stdout (debugging; the program's stdout is the same)"},
		&cli.StringFlag{Name: "metrics-addr", Usage: "serve Prometheus metrics (farmem_fault_duration_seconds, farmem_resident_bytes...) on HOST:PORT/metrics"},
		&cli.StringFlag{Name: "latency-out", TakesFile: true, Usage: "at exit, write every fault's service latency and every eviction batch's, as histograms, to FILE\n\t(CSV: what,lower_ns,upper_ns,count; what is a fault source: zero, backend, wp, cache; a reason\n\tfaults were held: held-room, held-busy, held-event; or eviction-batch): the whole\n\tdistribution, for a CDF (the summary gives p50/p99/p99.9)"},
		&cli.StringFlag{Name: "stats", Usage: "print one line of live figures on stderr every DURATION (e.g. 1s): faults/s by source\n\twith p99, evictions/s, resident vs cap"},
	}...)
}

// otelEnvHelp lists the OTEL_* variables farmem run honours (telemetry.Config.Resolve), for its help.
const otelEnvHelp = "OpenTelemetry: the standard OTEL_* variables are honoured; the flags override them.\n" +
	"   OTEL_EXPORTER_OTLP_ENDPOINT   where traces and metrics go (as --otlp); each signal's own first:\n" +
	"                                 OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, _METRICS_ENDPOINT. Nothing is\n" +
	"                                 exported unless an endpoint is given or an exporter variable names otlp\n" +
	"   OTEL_EXPORTER_OTLP_PROTOCOL   http/protobuf (the default; port 4318) or grpc (4317);\n" +
	"                                 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL and _METRICS_PROTOCOL first\n" +
	"   OTEL_EXPORTER_OTLP_HEADERS    and _CERTIFICATE, _COMPRESSION... (each signal's own first), as the\n" +
	"                                 OpenTelemetry SDK reads them\n" +
	"   OTEL_TRACES_EXPORTER          otlp, console (spans on stdout, as --trace-stdout) or none (no\n" +
	"                                 spans: with --otlp, only metrics go there)\n" +
	"   OTEL_METRICS_EXPORTER         otlp, console (stdout), prometheus (as --metrics-addr, on\n" +
	"                                 OTEL_EXPORTER_PROMETHEUS_HOST:_PORT, default localhost:9464) or none\n" +
	"   OTEL_TRACES_SAMPLER, _ARG     the share of faults traced, unless --trace-sample is given:\n" +
	"                                 always_on (1), always_off (0), traceidratio (ARG, default 1), and\n" +
	"                                 parentbased_* alike (a fault has no parent). always_off or a ratio\n" +
	"                                 of 0 also keeps no slow fault, unless --trace-slow is given\n" +
	"   OTEL_SERVICE_NAME             default farmem; OTEL_RESOURCE_ATTRIBUTES adds to the resource\n" +
	"   OTEL_METRIC_EXPORT_INTERVAL   milliseconds between metric exports (default here 10000)\n" +
	"   OTEL_SDK_DISABLED=true        only the flags export\n" +
	"A value farmem cannot honour (an unknown protocol, sampler or exporter) is bad input: exit 125."

// otlpFlags are --otlp and --otlp-protocol, for whatever a command exports (what).
func otlpFlags(what string) []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "otlp", Usage: "export " + what + " over OTLP to HOST:PORT (plaintext) or http[s]://HOST:PORT;\n\tdefault: OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)ENDPOINT (see OpenTelemetry above)"},
		&cli.StringFlag{Name: "otlp-protocol", Usage: "http/protobuf (port 4318 by convention) or grpc (4317), for traces and metrics; default: each\n\tsignal's OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)PROTOCOL, else http/protobuf, as OpenTelemetry has it"},
	}
}

// resolveOTLP reads --otlp and --otlp-protocol into cfg and resolves cfg against the OTEL_*
// environment; bad input is a usage error.
func resolveOTLP(c *cli.Context, cfg *telemetry.Config) error {
	cfg.Endpoint, cfg.Protocol = c.String("otlp"), c.String("otlp-protocol")
	if c.IsSet("otlp") && cfg.Endpoint == "" {
		return usagef("--otlp is empty: give HOST:PORT")
	}
	if err := cfg.Resolve(os.Getenv); err != nil {
		return usagef("%v", err)
	}
	return nil
}

// telemetryOptions reads the flags and the environment; bad input is a usage error.
func telemetryOptions(c *cli.Context, program string) (telemetry.Config, time.Duration, error) {
	cfg := telemetry.Config{Stdout: c.Bool("trace-stdout"), MetricsAddr: c.String("metrics-addr"), Program: filepath.Base(program),
		SlowMax: c.Int64("trace-slow-max")}
	var err error
	if cfg.Sample, err = strconv.ParseFloat(c.String("trace-sample"), 64); err != nil {
		return cfg, 0, usagef("--trace-sample %q: give a ratio from 0 to 1 (0.01: one fault in a hundred)", c.String("trace-sample"))
	}
	cfg.SampleSet, cfg.SlowSet = c.IsSet("trace-sample"), c.IsSet("trace-slow")
	if cfg.Slow, err = time.ParseDuration(c.String("trace-slow")); err != nil {
		return cfg, 0, usagef("--trace-slow %q: give a duration such as 100us or 1ms", c.String("trace-slow"))
	}
	if err := resolveOTLP(c, &cfg); err != nil {
		return cfg, 0, err
	}
	var every time.Duration
	if c.IsSet("stats") {
		if every, err = time.ParseDuration(c.String("stats")); err != nil || every <= 0 {
			return cfg, 0, usagef("--stats %q: give an interval such as 1s", c.String("stats"))
		}
	}
	return cfg, every, nil
}

// startTelemetry starts the exporters (and the /metrics listener: a port in use fails here,
// before the program starts). Export errors later are warned about once and never stop the run.
func startTelemetry(cfg telemetry.Config) (*telemetry.Telemetry, error) {
	t, err := telemetry.Start(context.Background(), cfg, func(msg string) { fmt.Fprintf(os.Stderr, "farmem: %s\n", msg) })
	if err != nil {
		return nil, usagef("%v", err)
	}
	return t, nil
}

// stopTelemetry flushes the last spans and metrics; an endpoint that does not answer holds up
// farmem's exit by at most a few seconds.
func stopTelemetry(t *telemetry.Telemetry, quiet bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t.Shutdown(ctx) // errors went to the error handler's one warning
	if n := t.Dropped(); n > 0 && !quiet {
		fmt.Fprintf(os.Stderr, "farmem: telemetry: %d sampled records were not traced (the span exporter was behind)\n", n)
	}
	if n := t.SlowSkipped(); n > 0 && !quiet {
		fmt.Fprintf(os.Stderr, "farmem: telemetry: %d faults slower than --trace-slow were not traced (over --trace-slow-max a second)\n", n)
	}
}

// startServerTelemetry starts a memory server's span exporter if --otlp or the environment asks
// for one (nil: none asked).
func startServerTelemetry(cfg telemetry.Config, advertise string) (*telemetry.ServerTelemetry, error) {
	if !cfg.Tracing() {
		return nil, nil
	}
	t, err := telemetry.StartServer(context.Background(), cfg, advertise, func(msg string) { fmt.Fprintf(os.Stderr, "farmem memserver: %s\n", msg) })
	if err != nil {
		return nil, usagef("%v", err)
	}
	return t, nil
}

// stopServerTelemetry exports the last spans; a collector that does not answer holds up the
// memory server's exit by at most a few seconds.
func stopServerTelemetry(t *telemetry.ServerTelemetry) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t.Shutdown(ctx) // errors went to the one warning
	if n := t.Dropped(); n > 0 {
		fmt.Fprintf(os.Stderr, "farmem memserver: telemetry: %d traced requests got no span (the span exporter was behind)\n", n)
	}
}
