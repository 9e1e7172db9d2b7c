package telemetry

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// This file decides, from the flags and the OTEL_* environment, what a run exports and how.
// The variables are the OpenTelemetry specification's (its "Environment Variable
// Specification" and the OTLP exporter's), read as the SDKs read them: empty is unset, enum
// values are case-insensitive, a signal's own variable wins over the general one. Where farmem
// differs (and farmem run's help says so: cmd/farmem/telemetry_flags.go): nothing is exported
// unless asked for (an endpoint, or an exporter variable naming otlp), since farmem wraps
// another program and must not start sending to localhost on its own; and a value farmem
// cannot honour is an error at start, not the SDKs' warning and fallback, because a run that
// silently exports nothing is worse than one that does not start.
//
// Why not go.opentelemetry.io/contrib/exporters/autoexport (v0.72.0 goes with this SDK): it
// takes its whole configuration from the environment, and farmem's flags (--otlp,
// --otlp-protocol, --metrics-addr) must override the environment; it exports to localhost by
// default (OTEL_TRACES_EXPORTER defaults to otlp), where farmem exports nothing unless asked;
// its exporters keep the SDK's 10 s timeout and minute of retries, which would hold up the
// program's exit behind a collector that is down; and it brings the log exporters and a
// Prometheus server of its own. What it would do for farmem is the few switches below.

// Protocols are the OTLP protocols farmem speaks.
const (
	ProtoGRPC = "grpc"
	ProtoHTTP = "http/protobuf"
)

// Defaults of the run flags.
const (
	// DefaultSample traces one fault in a thousand: at the fault rates of a paging program, one
	// in a hundred cost the fault path more than the 2 % tracing may take of it, end to end (the
	// spans, their export, a receiver on the same CPUs): results/telemetry.md, section 0.
	DefaultSample = 0.001
	DefaultSlow   = 100 * time.Microsecond
	// DefaultSlowMax bounds the faults traced for being slow to 100 a second: enough to see
	// every kind of slow fault a run has, few enough that an overloaded machine, where most
	// faults are slow, is not loaded further by tracing them all (results/telemetry.md).
	DefaultSlowMax = 100
)

// The Prometheus exporter's address when OTEL_METRICS_EXPORTER names it and neither
// --metrics-addr nor OTEL_EXPORTER_PROMETHEUS_HOST/_PORT says otherwise (the specification's).
const (
	defaultPromHost = "localhost"
	defaultPromPort = "9464"
)

// Config is what the run flags and the OTEL_* environment ask for. Flags override the
// environment; Resolve fills in the rest.
type Config struct {
	// Endpoint is --otlp: HOST:PORT (plaintext, for a collector on the host or a trusted
	// network) or a URL (http:// or https://), for both signals. Empty: the
	// OTEL_EXPORTER_OTLP_(TRACES_|METRICS_)ENDPOINT variables, which the exporters read.
	Endpoint string
	// Protocol is --otlp-protocol, for both signals; empty: each signal's protocol variable,
	// then OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf.
	Protocol string
	Sample   float64       // head sampling ratio of faults, 0..1
	Slow     time.Duration // faults (and prefetch batches) slower than this are traced; 0: none
	SlowMax  int64         // but at most this many a second (the rest are counted); 0: no bound
	// SampleSet and SlowSet say that Sample and Slow were given as flags: OTEL_TRACES_SAMPLER
	// then changes neither.
	SampleSet, SlowSet bool
	Stdout             bool // also write spans to stdout, pretty-printed (debugging)
	// MetricsAddr is --metrics-addr: HOST:PORT to serve Prometheus's /metrics on.
	MetricsAddr string
	Program     string // the program's name, a resource attribute

	// Resolved by Resolve.
	traces, metrics               bool   // export the signal over OTLP
	tracesProto, metricsProto     string // and with which protocol
	tracesConsole, metricsConsole bool   // write the signal to stdout
	sampler                       samplerSpec
	tracesHint, metricsHint       string // said with a failed export: why it may have failed
	metricInterval                string // OTEL_METRIC_EXPORT_INTERVAL as given (the reader reads it)
	metricsAddrFrom               string // what asked for MetricsAddr, for its errors
}

// Env is the environment Resolve reads (os.Getenv in farmem; a map in tests).
type Env func(string) string

// Resolve validates c and decides, from c and the environment, what is exported. An error is
// the user's: a bad protocol, sampler, exporter, ratio or endpoint, named as the user gave it.
func (c *Config) Resolve(env Env) error {
	get := func(k string) string { return strings.TrimSpace(env(k)) }
	if c.Sample < 0 || c.Sample > 1 || c.Sample != c.Sample {
		return fmt.Errorf("--trace-sample %v: give a ratio from 0 to 1 (0.01: one fault in a hundred)", c.Sample)
	}
	if c.SlowMax < 0 {
		return fmt.Errorf("--trace-slow-max %d: give a number of faults a second, 0 or more (0: no bound)", c.SlowMax)
	}
	if c.Slow < 0 {
		return fmt.Errorf("--trace-slow %v: give a duration of 0 or more (0: keep no fault for being slow)", c.Slow)
	}
	if c.Endpoint != "" {
		if _, _, err := splitEndpoint(c.Endpoint); err != nil {
			return fmt.Errorf("--otlp %q: %v", c.Endpoint, err)
		}
	}
	if c.MetricsAddr != "" {
		c.metricsAddrFrom = "--metrics-addr " + c.MetricsAddr
		if err := checkHostPort(c.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr %q: give HOST:PORT (e.g. 127.0.0.1:9464): %v", c.MetricsAddr, err)
		}
	}
	if c.Protocol != "" {
		if err := checkProtocol(c.Protocol); err != nil {
			return fmt.Errorf("--otlp-protocol %q: %v", c.Protocol, err)
		}
	}
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		// Only what the flags ask for: --otlp for both signals, --trace-stdout, --metrics-addr.
		get = func(string) string { return "" }
	}

	tracesExp, err := exporters(get, "OTEL_TRACES_EXPORTER", "otlp", "console", "none")
	if err != nil {
		return err
	}
	metricsExp, err := exporters(get, "OTEL_METRICS_EXPORTER", "otlp", "console", "prometheus", "none")
	if err != nil {
		return err
	}
	// An exporter variable picks the signal's exporters; without one, an endpoint asks for OTLP.
	tracesEP := firstOf(c.Endpoint, get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT"))
	metricsEP := firstOf(c.Endpoint, get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT"))
	c.traces, c.tracesConsole = tracesEP != "", false
	if tracesExp != nil {
		c.traces, c.tracesConsole = tracesExp["otlp"], tracesExp["console"]
	}
	c.metrics, c.metricsConsole = metricsEP != "", false
	if metricsExp != nil {
		c.metrics, c.metricsConsole = metricsExp["otlp"], metricsExp["console"]
		if metricsExp["prometheus"] && c.MetricsAddr == "" {
			host, port := firstOf(get("OTEL_EXPORTER_PROMETHEUS_HOST"), defaultPromHost), firstOf(get("OTEL_EXPORTER_PROMETHEUS_PORT"), defaultPromPort)
			c.MetricsAddr = net.JoinHostPort(host, port)
			c.metricsAddrFrom = "OTEL_METRICS_EXPORTER=prometheus on " + c.MetricsAddr
			if err := checkHostPort(c.MetricsAddr); err != nil {
				return fmt.Errorf("OTEL_EXPORTER_PROMETHEUS_HOST/_PORT %q: %v", c.MetricsAddr, err)
			}
		}
	}

	// Each signal's protocol: the flag, its own variable, the general one, the default.
	if c.traces {
		if c.tracesProto, c.tracesHint, err = protocol(c.Protocol, get, "TRACES", tracesEP); err != nil {
			return err
		}
	}
	if c.metrics {
		if c.metricsProto, c.metricsHint, err = protocol(c.Protocol, get, "METRICS", metricsEP); err != nil {
			return err
		}
	}
	c.metricInterval = get("OTEL_METRIC_EXPORT_INTERVAL")
	if c.metricInterval != "" {
		if ms, err := strconv.Atoi(c.metricInterval); err != nil || ms <= 0 {
			return fmt.Errorf("OTEL_METRIC_EXPORT_INTERVAL=%q: give milliseconds, more than 0", c.metricInterval)
		}
	}

	if c.Tracing() {
		if c.sampler, err = parseSampler(get); err != nil {
			return err
		}
		if c.sampler.set && !c.SampleSet {
			c.Sample = c.sampler.ratio
			if c.Sample == 0 && !c.SlowSet {
				c.Slow = 0 // "off" means no spans, not the slow faults' spans
			}
		}
	}
	return nil
}

// hint is what a failed export's warning adds: why it may have failed ("" if nothing says).
func (c *Config) hint() string {
	if h := firstOf(c.tracesHint, c.metricsHint); h != "" {
		return "; " + h
	}
	return ""
}

// TracesTo says where spans go, for a log line: "127.0.0.1:4318 over OTLP (http/protobuf)".
func (c *Config) TracesTo() string {
	var to []string
	if c.traces {
		ep := c.Endpoint
		if ep == "" {
			ep = "the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT endpoint"
		}
		to = append(to, fmt.Sprintf("%s over OTLP (%s)", ep, c.tracesProto))
	}
	if c.Stdout || c.tracesConsole {
		to = append(to, "stdout")
	}
	return strings.Join(to, " and ")
}

// Tracing reports whether spans are made at all (an exporter for them).
func (c *Config) Tracing() bool { return c.traces || c.tracesConsole || c.Stdout }

// Enabled reports whether anything is exported.
func (c *Config) Enabled() bool {
	return c.Tracing() || c.metrics || c.metricsConsole || c.MetricsAddr != ""
}

// metricsReader reports whether a periodic reader pushes metrics somewhere (OTLP or stdout).
func (c *Config) metricsReader() bool { return c.metrics || c.metricsConsole }

// exporters parses an exporter variable (a comma-separated list): nil if it is unset, else the
// set of the names in it; a name farmem does not export to is an error.
func exporters(get func(string) string, name string, allowed ...string) (map[string]bool, error) {
	v := get(name)
	if v == "" {
		return nil, nil
	}
	set := map[string]bool{}
	for _, e := range strings.Split(v, ",") {
		e = strings.ToLower(strings.TrimSpace(e))
		ok := false
		for _, a := range allowed {
			ok = ok || e == a
		}
		if !ok {
			return nil, fmt.Errorf("%s=%q: farmem exports to %s", name, v, orList(allowed))
		}
		set[e] = true
	}
	if set["none"] && len(set) > 1 {
		return nil, fmt.Errorf("%s=%q: none with other exporters; give none alone", name, v)
	}
	return set, nil
}

// protocol is a signal's OTLP protocol: flag, OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL,
// OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf. hint is said if an export fails: the
// default protocol sent to 4317, OTLP/gRPC's port, is the likely mistake.
func protocol(flag string, get func(string) string, signal, endpoint string) (proto, hint string, err error) {
	if flag != "" {
		return strings.ToLower(flag), "", nil
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := get(k); v != "" {
			if err := checkProtocol(v); err != nil {
				return "", "", fmt.Errorf("%s=%q: %v", k, v, err)
			}
			return strings.ToLower(v), "", nil
		}
	}
	if endpointPort(endpoint) == "4317" {
		hint = "no OTLP protocol was set, so it is http/protobuf (the OpenTelemetry default), and port 4317 is OTLP/gRPC's: " +
			"give --otlp-protocol grpc or OTEL_EXPORTER_OTLP_PROTOCOL=grpc, or the collector's HTTP port (4318)"
	}
	return ProtoHTTP, hint, nil
}

func checkProtocol(p string) error {
	switch strings.ToLower(p) {
	case ProtoGRPC, ProtoHTTP:
		return nil
	case "http/json":
		return fmt.Errorf("farmem's OTLP exporters speak grpc or http/protobuf, not http/json")
	}
	return fmt.Errorf("give grpc or http/protobuf")
}

// samplerSpec is OTEL_TRACES_SAMPLER(_ARG), parsed.
type samplerSpec struct {
	set         bool    // OTEL_TRACES_SAMPLER was given
	name        string  // as the specification names it, lower case
	ratio       float64 // the share of root spans it samples: 1, 0 or its argument
	parentBased bool
}

var samplerNames = []string{"always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}

// parseSampler reads OTEL_TRACES_SAMPLER and, for the ratio samplers, OTEL_TRACES_SAMPLER_ARG
// (default 1, as the specification has it).
func parseSampler(get func(string) string) (samplerSpec, error) {
	v := get("OTEL_TRACES_SAMPLER")
	if v == "" {
		return samplerSpec{}, nil
	}
	s := samplerSpec{set: true, name: strings.ToLower(v)}
	base := strings.TrimPrefix(s.name, "parentbased_")
	s.parentBased = base != s.name
	switch base {
	case "always_on":
		s.ratio = 1
	case "always_off":
		s.ratio = 0
	case "traceidratio":
		s.ratio = 1
		if arg := get("OTEL_TRACES_SAMPLER_ARG"); arg != "" {
			r, err := strconv.ParseFloat(arg, 64)
			if err != nil || r < 0 || r > 1 || r != r {
				return s, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: give a ratio from 0 to 1 for %s", arg, s.name)
			}
			s.ratio = r
		}
	case "jaeger_remote", "xray":
		return s, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: farmem has no remote sampler; give %s", v, orList(samplerNames))
	default:
		return s, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: give %s", v, orList(samplerNames))
	}
	return s, nil
}

// sdk is the SDK sampler for a memory server's spans, whose parent is always the client's
// (remote) span; unset, a span is kept exactly when the client kept its fault.
func (s samplerSpec) sdk() sdktrace.Sampler {
	if !s.set {
		return sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	var root sdktrace.Sampler
	switch {
	case s.ratio >= 1:
		root = sdktrace.AlwaysSample()
	case s.ratio <= 0:
		root = sdktrace.NeverSample()
	default:
		root = sdktrace.TraceIDRatioBased(s.ratio)
	}
	if s.parentBased {
		return sdktrace.ParentBased(root)
	}
	return root
}

func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func checkHostPort(hp string) error {
	_, port, err := net.SplitHostPort(hp)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a port number", port)
	}
	return nil
}

// endpointPort is the port of an endpoint as --otlp or the variables give it ("" if none).
func endpointPort(ep string) string {
	if ep == "" {
		return ""
	}
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return ""
		}
		return u.Port()
	}
	_, port, _ := net.SplitHostPort(ep)
	return port
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
		return "", false, fmt.Errorf("give HOST:PORT (e.g. 127.0.0.1:4318): %v", err)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", false, fmt.Errorf("port %q is not a port number", port)
	}
	return net.JoinHostPort(host, port), insecure, nil
}
