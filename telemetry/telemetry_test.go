package telemetry

import (
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/latency"
)

func env(kv ...string) Env {
	m := map[string]string{}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// What is exported, and over which protocol, from the flags and the OTEL_* environment.
func TestResolve(t *testing.T) {
	const H, G = ProtoHTTP, ProtoGRPC
	for _, c := range []struct {
		cfg             Config
		env             Env
		traces, metrics bool
		tproto, mproto  string // "": not checked
		err             string
	}{
		{cfg: Config{Sample: 0.01}, env: env()},
		// No protocol anywhere: http/protobuf, the specification's default, whatever the port.
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), true, true, H, H, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), true, true, H, H, ""},
		{Config{Sample: 0.01, Endpoint: "127.0.0.1:4317"}, env(), true, true, H, H, ""},
		// A signal's own endpoint exports that signal only.
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/v1/traces"), true, false, H, "", ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://c:4318/v1/metrics"), false, true, "", H, ""},
		// The general protocol variable, and each signal's own over it.
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), true, true, G, G, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"), true, true, G, H, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc",
			"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "HTTP/Protobuf"), true, true, G, H, ""},
		// The flag over every variable.
		{Config{Sample: 0.01, Endpoint: "127.0.0.1:4318", Protocol: "grpc"}, env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf",
			"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"), true, true, G, G, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317", "OTEL_SDK_DISABLED", "true"), false, false, "", "", ""},
		// The exporter variables.
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_TRACES_EXPORTER", "none"), false, true, "", H, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_METRICS_EXPORTER", "none"), true, false, H, "", ""},
		{Config{Sample: 0.01, Endpoint: "c:4318"}, env("OTEL_TRACES_EXPORTER", "none"), false, true, "", H, ""},
		{Config{Sample: 0.01}, env("OTEL_TRACES_EXPORTER", "otlp"), true, false, H, "", ""}, // the SDK's default endpoint
		{Config{Sample: 0.01}, env("OTEL_TRACES_EXPORTER", "console, OTLP", "OTEL_METRICS_EXPORTER", "otlp"), true, true, H, H, ""},
		// Bad input, named as given.
		{Config{Sample: 0.01, Endpoint: "c:4317", Protocol: "udp"}, env(), false, false, "", "", `--otlp-protocol "udp": give grpc or http/protobuf`},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"), false, false, "", "", `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": farmem's OTLP exporters speak grpc or http/protobuf`},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "thrift"), false, false, "", "", `OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="thrift": give grpc or http/protobuf`},
		{Config{Sample: 0.01}, env("OTEL_TRACES_EXPORTER", "zipkin"), false, false, "", "", `OTEL_TRACES_EXPORTER="zipkin": farmem exports to otlp, console or none`},
		{Config{Sample: 0.01}, env("OTEL_METRICS_EXPORTER", "otlp,none"), false, false, "", "", `OTEL_METRICS_EXPORTER="otlp,none": none with other exporters`},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_TRACES_SAMPLER", "sometimes"), false, false, "", "", `OTEL_TRACES_SAMPLER="sometimes": give always_on, always_off, traceidratio`},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_TRACES_SAMPLER", "jaeger_remote"), false, false, "", "", `OTEL_TRACES_SAMPLER="jaeger_remote": farmem has no remote sampler`},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "1.5"), false, false, "", "", `OTEL_TRACES_SAMPLER_ARG="1.5": give a ratio from 0 to 1`},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_METRIC_EXPORT_INTERVAL", "10s"), false, false, "", "", `OTEL_METRIC_EXPORT_INTERVAL="10s": give milliseconds`},
		{Config{Sample: 2}, env(), false, false, "", "", "--trace-sample 2"},
		{Config{Sample: 0.01, Slow: -time.Second}, env(), false, false, "", "", "--trace-slow"},
		{Config{Sample: 0.01, Endpoint: "ftp://c:1"}, env(), false, false, "", "", `scheme "ftp"`},
		{Config{Sample: 0.01, Endpoint: "c:99999"}, env(), false, false, "", "", "not a port number"},
		{Config{Sample: 0.01, MetricsAddr: ":x:"}, env(), false, false, "", "", "--metrics-addr"},
		{Config{Sample: 0.01}, env("OTEL_METRICS_EXPORTER", "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT", "http"), false, false, "", "", "OTEL_EXPORTER_PROMETHEUS_HOST/_PORT"},
	} {
		cfg := c.cfg
		err := cfg.Resolve(c.env)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want %q", c.cfg, err, c.err)
			}
			continue
		}
		if err != nil || cfg.traces != c.traces || cfg.metrics != c.metrics || (c.tproto != "" && cfg.tracesProto != c.tproto) ||
			(c.mproto != "" && cfg.metricsProto != c.mproto) {
			t.Errorf("%+v: traces %v (%q) metrics %v (%q) err %v; want %v (%q) %v (%q)", c.cfg, cfg.traces, cfg.tracesProto, cfg.metrics, cfg.metricsProto, err,
				c.traces, c.tproto, c.metrics, c.mproto)
		}
	}
}

// OTEL_TRACES_SAMPLER(_ARG) sets the share of faults traced unless --trace-sample does; off
// (always_off, a ratio of 0) keeps no slow fault either unless --trace-slow says so. Console
// exporters and the Prometheus variables resolve as the help says.
func TestResolveSamplerAndExporters(t *testing.T) {
	ep := []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"}
	for _, c := range []struct {
		cfg    Config
		env    []string
		sample float64
		slow   time.Duration
	}{
		{Config{Sample: 0.01, Slow: DefaultSlow}, nil, 0.01, DefaultSlow},
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "always_on"}, 1, DefaultSlow},
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "parentbased_always_on"}, 1, DefaultSlow},
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "ALWAYS_OFF"}, 0, 0},
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "traceidratio"}, 1, DefaultSlow},
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "traceidratio", "OTEL_TRACES_SAMPLER_ARG", "0.25"}, 0.25, DefaultSlow},
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG", "0"}, 0, 0},
		{Config{Sample: 0.01, Slow: time.Millisecond, SlowSet: true}, []string{"OTEL_TRACES_SAMPLER", "always_off"}, 0, time.Millisecond},
		{Config{Sample: 0.5, SampleSet: true, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "always_off"}, 0.5, DefaultSlow},
		// The argument of a sampler that takes none is not read.
		{Config{Sample: 0.01, Slow: DefaultSlow}, []string{"OTEL_TRACES_SAMPLER", "always_on", "OTEL_TRACES_SAMPLER_ARG", "x"}, 1, DefaultSlow},
	} {
		cfg := c.cfg
		if err := cfg.Resolve(env(append(ep, c.env...)...)); err != nil || cfg.Sample != c.sample || cfg.Slow != c.slow {
			t.Errorf("%v: sample %v slow %v (%v), want %v %v", c.env, cfg.Sample, cfg.Slow, err, c.sample, c.slow)
		}
	}

	cfg := Config{}
	if err := cfg.Resolve(env("OTEL_TRACES_EXPORTER", "console", "OTEL_METRICS_EXPORTER", "console,prometheus",
		"OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if cfg.traces || cfg.metrics || !cfg.tracesConsole || !cfg.metricsConsole || !cfg.Tracing() || cfg.MetricsAddr != "127.0.0.1:9464" {
		t.Errorf("console and prometheus exporters: %+v", cfg)
	}
	cfg = Config{MetricsAddr: "127.0.0.1:1234"}
	if err := cfg.Resolve(env("OTEL_METRICS_EXPORTER", "prometheus", "OTEL_EXPORTER_PROMETHEUS_PORT", "9999")); err != nil || cfg.MetricsAddr != "127.0.0.1:1234" {
		t.Errorf("--metrics-addr must win over the Prometheus variables: %q, %v", cfg.MetricsAddr, err)
	}
	// A failed export to 4317 with the protocol left to its default says why it may have failed.
	cfg = Config{Endpoint: "127.0.0.1:4317"}
	if err := cfg.Resolve(env()); err != nil || !strings.Contains(cfg.hint(), "port 4317 is OTLP/gRPC's") {
		t.Errorf("no hint for http/protobuf to 4317: %q, %v", cfg.hint(), err)
	}
	cfg = Config{Endpoint: "127.0.0.1:4317", Protocol: "http/protobuf"}
	if err := cfg.Resolve(env()); err != nil || cfg.hint() != "" {
		t.Errorf("a hint though the protocol was given: %q, %v", cfg.hint(), err)
	}
}

// A memory server's spans follow the client's decision unless OTEL_TRACES_SAMPLER says
// otherwise.
func TestServerSampler(t *testing.T) {
	for name, want := range map[string]string{
		"":                         "ParentBased{root:AlwaysOnSampler",
		"always_off":               "AlwaysOffSampler",
		"parentbased_traceidratio": "ParentBased{root:TraceIDRatioBased{0.5}",
		"traceidratio":             "TraceIDRatioBased{0.5}",
	} {
		cfg := Config{}
		if err := cfg.Resolve(env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318", "OTEL_TRACES_SAMPLER", name, "OTEL_TRACES_SAMPLER_ARG", "0.5")); err != nil {
			t.Fatal(err)
		}
		if got := cfg.sampler.sdk().Description(); !strings.HasPrefix(got, want) {
			t.Errorf("OTEL_TRACES_SAMPLER=%q: the server's sampler is %s, want %s", name, got, want)
		}
	}
}

// The fault-duration histogram's explicit buckets hold every recorded fault, each in the bucket
// of its bound (to within the log-linear histogram's 12.5 %).
func TestLatencyBuckets(t *testing.T) {
	var h latency.Histogram
	for _, d := range []time.Duration{500 * time.Nanosecond, 3 * time.Microsecond, 4 * time.Microsecond, 70 * time.Microsecond, 3 * time.Millisecond, 5 * time.Second} {
		h.Record(d)
	}
	var s latency.Snapshot
	h.Snapshot(&s)
	counts := make([]uint64, len(latencyBounds)+1)
	s.Cumulate(latencyBounds, counts)
	want := map[int]uint64{0: 1, 2: 2, 6: 1, 11: 1, len(latencyBounds): 1} // <=1us, <=5us, <=100us, <=5ms, +Inf
	for i, c := range counts {
		if c != want[i] {
			t.Errorf("bucket %d (le %v): %d, want %d (all %v)", i, latencyBounds[min(i, len(latencyBounds)-1)], c, want[i], counts)
		}
	}
}
