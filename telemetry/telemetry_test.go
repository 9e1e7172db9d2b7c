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
	for _, c := range []struct {
		cfg             Config
		env             Env
		traces, metrics bool
		proto, err      string
	}{
		{Config{Sample: 0.01}, env(), false, false, ProtoGRPC, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"), true, true, ProtoGRPC, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), true, true, ProtoHTTP, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4317/v1/traces"), true, false, ProtoGRPC, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"), true, true, ProtoHTTP, ""},
		{Config{Sample: 0.01, Endpoint: "127.0.0.1:4318"}, env(), true, true, ProtoHTTP, ""},
		{Config{Sample: 0.01, Endpoint: "127.0.0.1:4318", Protocol: "grpc"}, env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"), true, true, ProtoGRPC, ""},
		{Config{Sample: 0.01}, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317", "OTEL_SDK_DISABLED", "true"), false, false, "", ""},
		{Config{Sample: 0.01, Endpoint: "c:4317", Protocol: "udp"}, env(), false, false, "", `OTLP protocol "udp"`},
		{Config{Sample: 2}, env(), false, false, "", "--trace-sample 2"},
		{Config{Sample: 0.01, Slow: -time.Second}, env(), false, false, "", "--trace-slow"},
		{Config{Sample: 0.01, Endpoint: "ftp://c:1"}, env(), false, false, "", `scheme "ftp"`},
		{Config{Sample: 0.01, Endpoint: "c:99999"}, env(), false, false, "", "not a port number"},
		{Config{Sample: 0.01, MetricsAddr: ":x:"}, env(), false, false, "", "--metrics-addr"},
	} {
		cfg := c.cfg
		err := cfg.Resolve(c.env)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: error %v, want %q", c.cfg, err, c.err)
			}
			continue
		}
		if err != nil || cfg.traces != c.traces || cfg.metrics != c.metrics || (c.proto != "" && cfg.Protocol != c.proto) {
			t.Errorf("%+v: traces %v metrics %v protocol %q err %v; want %v %v %q", c.cfg, cfg.traces, cfg.metrics, cfg.Protocol, err, c.traces, c.metrics, c.proto)
		}
	}
}

// The fault-latency histogram's explicit buckets hold every recorded fault, each in the bucket
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
