package main

// End-to-end tests of farmem run's telemetry: a real OTLP receiver in the test (the collector's
// gRPC TraceService/MetricsService, and OTLP/HTTP as a net/http handler decoding the protobuf)
// gets a capped run's spans and metrics; the Prometheus endpoint is scraped while a run pages.

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/farmem/farmem/launcher"
)

// otlpSink keeps everything an OTLP receiver was sent.
type otlpSink struct {
	mu      sync.Mutex
	traces  []*tracepb.ResourceSpans
	metrics []*metricspb.ResourceMetrics
	headers []http.Header // OTLP/HTTP requests' headers
}

func (s *otlpSink) addTraces(rs []*tracepb.ResourceSpans) {
	s.mu.Lock()
	s.traces = append(s.traces, rs...)
	s.mu.Unlock()
}

func (s *otlpSink) addMetrics(rm []*metricspb.ResourceMetrics) {
	s.mu.Lock()
	s.metrics = append(s.metrics, rm...)
	s.mu.Unlock()
}

// reset forgets everything received so far.
func (s *otlpSink) reset() {
	s.mu.Lock()
	s.traces, s.metrics, s.headers = nil, nil, nil
	s.mu.Unlock()
}

type traceService struct {
	colltrace.UnimplementedTraceServiceServer
	s *otlpSink
}

func (t traceService) Export(_ context.Context, r *colltrace.ExportTraceServiceRequest) (*colltrace.ExportTraceServiceResponse, error) {
	t.s.addTraces(r.ResourceSpans)
	return &colltrace.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	collmetrics.UnimplementedMetricsServiceServer
	s *otlpSink
}

func (m metricsService) Export(_ context.Context, r *collmetrics.ExportMetricsServiceRequest) (*collmetrics.ExportMetricsServiceResponse, error) {
	m.s.addMetrics(r.ResourceMetrics)
	return &collmetrics.ExportMetricsServiceResponse{}, nil
}

// startGRPCSink serves OTLP/gRPC on a loopback port and returns its HOST:PORT.
func startGRPCSink(t *testing.T) (string, *otlpSink) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveGRPCSink(t, ln)
}

// serveGRPCSink serves OTLP/gRPC on ln.
func serveGRPCSink(t *testing.T, ln net.Listener) (string, *otlpSink) {
	s := &otlpSink{}
	srv := grpc.NewServer()
	colltrace.RegisterTraceServiceServer(srv, traceService{s: s})
	collmetrics.RegisterMetricsServiceServer(srv, metricsService{s: s})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), s
}

// startHTTPSink serves OTLP/HTTP (binary protobuf, gzip or not) on a loopback port.
func startHTTPSink(t *testing.T) (string, *otlpSink) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &otlpSink{}
	read := func(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			z, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return false
			}
			body = z
		}
		b, err := io.ReadAll(body)
		if err == nil {
			err = proto.Unmarshal(b, m)
		}
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, fmt.Sprintf("bad OTLP/HTTP request (%s): %v", r.Header.Get("Content-Type"), err), http.StatusBadRequest)
			return false
		}
		s.mu.Lock()
		s.headers = append(s.headers, r.Header.Clone())
		s.mu.Unlock()
		return true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/traces", func(w http.ResponseWriter, r *http.Request) {
		var req colltrace.ExportTraceServiceRequest
		if read(w, r, &req) {
			s.addTraces(req.ResourceSpans)
			b, _ := proto.Marshal(&colltrace.ExportTraceServiceResponse{})
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.Write(b)
		}
	})
	mux.HandleFunc("/v1/metrics", func(w http.ResponseWriter, r *http.Request) {
		var req collmetrics.ExportMetricsServiceRequest
		if read(w, r, &req) {
			s.addMetrics(req.ResourceMetrics)
			b, _ := proto.Marshal(&collmetrics.ExportMetricsServiceResponse{})
			w.Header().Set("Content-Type", "application/x-protobuf")
			w.Write(b)
		}
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), s
}

// span is an exported span with its resource's attributes.
type span struct {
	*tracepb.Span
	res map[string]string
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			m[kv.Key] = strconv.FormatBool(v.BoolValue)
		default:
			m[kv.Key] = kv.Value.String()
		}
	}
	return m
}

func (s *otlpSink) spans() []span {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []span
	for _, rs := range s.traces {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				out = append(out, span{sp, res})
			}
		}
	}
	return out
}

// lastSums returns the last exported value of an int counter by one attribute's value.
func (s *otlpSink) lastSums(name, key string) map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, at := map[string]int64{}, map[string]uint64{}
	for _, rm := range s.metrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name || m.GetSum() == nil {
					continue
				}
				for _, dp := range m.GetSum().DataPoints {
					k := attrs(dp.Attributes)[key]
					if dp.TimeUnixNano >= at[k] {
						out[k], at[k] = dp.GetAsInt(), dp.TimeUnixNano
					}
				}
			}
		}
	}
	return out
}

// lastHistogramCounts returns the last exported count of a histogram by one attribute's value.
func (s *otlpSink) lastHistogramCounts(name, key string) map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, at := map[string]uint64{}, map[string]uint64{}
	for _, rm := range s.metrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name || m.GetHistogram() == nil {
					continue
				}
				for _, dp := range m.GetHistogram().DataPoints {
					k := attrs(dp.Attributes)[key]
					var sum uint64
					for _, c := range dp.BucketCounts {
						sum += c
					}
					if sum != dp.Count {
						panic(fmt.Sprintf("histogram %s{%s}: buckets add up to %d, count %d", name, k, sum, dp.Count))
					}
					if dp.TimeUnixNano >= at[k] {
						out[k], at[k] = dp.Count, dp.TimeUnixNano
					}
				}
			}
		}
	}
	return out
}

// metricUnits returns the unit of every metric exported, by name.
func (s *otlpSink) metricUnits() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for _, rm := range s.metrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				out[m.Name] = m.Unit
			}
		}
	}
	return out
}

// lastGauge returns the last exported value of an int gauge (-1: none).
func (s *otlpSink) lastGauge(name string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, at := int64(-1), uint64(0)
	for _, rm := range s.metrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if m.Name != name || m.GetGauge() == nil {
					continue
				}
				for _, dp := range m.GetGauge().DataPoints {
					if dp.TimeUnixNano >= at {
						v, at = dp.GetAsInt(), dp.TimeUnixNano
					}
				}
			}
		}
	}
	return v
}

// counts is how many spans and metric batches (resources) the sink got.
func (s *otlpSink) counts() (spans, metrics int) {
	s.mu.Lock()
	n := len(s.metrics)
	s.mu.Unlock()
	return len(s.spans()), n
}

// summaryFaults is the summary's count of faults by source, named as the metrics name them.
func summaryFaults(s *launcher.Summary) map[string]int64 {
	got := map[string]int64{}
	for name, h := range s.Faults {
		if name == "cache" {
			name = "prefetch_cache" // what the metrics call it
		}
		got[name] = int64(h.Count)
	}
	return got
}

// runMicroSummary is runMicro with --summary-json: it returns the run's summary too.
func runMicroSummary(t *testing.T, env []string, flags ...string) (string, *launcher.Summary) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "summary.json")
	out := runMicro(t, env, append([]string{"--summary-json", path}, flags...)...)
	return out, readSummary(t, path)
}

// runMicro runs micro under farmem at a 16 MiB cap with extra flags and environment; it fails
// the test unless every page verified.
func runMicro(t *testing.T, env []string, flags ...string) string {
	t.Helper()
	args := append([]string{"run", "--local-mem", "16MiB"}, flags...)
	args = append(args, "--", filepath.Join(binDir, "micro"), "--mib", "40", "--pattern", "seq", "--passes", "2")
	cmd := exec.Command(farmemBin(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("farmem %s:\n%s", strings.Join(flags, " "), lastLines(out.String(), 8))
	if err != nil || !strings.Contains(out.String(), "micro: OK bad=0") {
		t.Fatalf("micro under farmem failed: %v", err)
	}
	return out.String()
}

// cleanEnv is the test's environment without OTEL_* variables, so a developer's shell cannot
// point a test's run at another collector.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return env
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(len(l)-n, 0):], "\n")
}

// checkFaultSpans asserts that the sink holds fault spans as documented: attributes, and the
// stages as child spans of the same trace; backend faults with a backend fetch child. sampled:
// the run traced a fifth of the faults or more, so spans of backend faults and of eviction batches are
// certain; at the default sampling (0.1 %) the spans are mostly those of slow faults, and which
// faults are slow is up to the machine's load (a loaded one spends the slow spans' budget on
// first touches): some fault span is all that is certain.
func checkFaultSpans(t *testing.T, s *otlpSink, service string, sampled bool) {
	t.Helper()
	spans := s.spans()
	byID := map[string]span{}
	children := map[string][]span{}
	for _, sp := range spans {
		byID[string(sp.SpanId)] = sp
		if len(sp.ParentSpanId) > 0 {
			children[string(sp.ParentSpanId)] = append(children[string(sp.ParentSpanId)], sp)
		}
	}
	var faults, backend, evictions int
	kinds, sources := map[string]int{}, map[string]int{}
	for _, sp := range spans {
		if sp.res["service.name"] != service {
			t.Fatalf("span %q has service.name %q, want %q", sp.Name, sp.res["service.name"], service)
		}
		switch sp.Name {
		case "eviction batch":
			evictions++
			continue
		case "page fault":
		default:
			continue
		}
		faults++
		a := attrs(sp.Attributes)
		// process.pid: on the span the program's, on the resource farmem's (semantic conventions).
		pid, _ := strconv.Atoi(a["process.pid"])
		farmemPid, _ := strconv.Atoi(sp.res["process.pid"])
		if pid <= 0 || farmemPid <= 0 || pid == farmemPid || sp.res["farmem.pid"] != "" {
			t.Fatalf("fault span: process.pid %q is not the program's, or the resource's %q (farmem.pid %q) is not farmem's",
				a["process.pid"], sp.res["process.pid"], sp.res["farmem.pid"])
		}
		addr, err := strconv.ParseUint(strings.TrimPrefix(a["farmem.page.address"], "0x"), 16, 64)
		if err != nil || addr == 0 || addr%4096 != 0 {
			t.Fatalf("fault span: farmem.page.address %q is not a page address", a["farmem.page.address"])
		}
		kinds[a["farmem.fault.kind"]]++
		sources[a["farmem.fault.source"]]++
		if sp.EndTimeUnixNano < sp.StartTimeUnixNano || sp.StartTimeUnixNano == 0 {
			t.Fatalf("fault span runs from %d to %d", sp.StartTimeUnixNano, sp.EndTimeUnixNano)
		}
		stages := map[string]span{}
		for _, c := range children[string(sp.SpanId)] {
			if !bytes.Equal(c.TraceId, sp.TraceId) {
				t.Fatalf("stage %q is in another trace than its fault", c.Name)
			}
			stages[c.Name] = c
		}
		for _, st := range []string{"queue wait", "lookup"} {
			if _, ok := stages[st]; !ok {
				t.Fatalf("fault span (source %s) has no %q stage; it has %v", a["farmem.fault.source"], st, keys(stages))
			}
		}
		_, install := stages["install"]
		_, wake := stages["wake"]
		if !install && !wake && a["farmem.fault.source"] != "wp" { // a write to a page being evicted is woken by its batch
			t.Fatalf("fault span (source %s) has neither install nor wake stage: %v", a["farmem.fault.source"], keys(stages))
		}
		if in, ok := stages["install"]; ok {
			// The ioctl the fault thread issued: a WP fault's un-protect, a fetched page's
			// COPY, and for a zero fill COPY (a write, or an evicted all-zero page) or ZEROPAGE.
			want := map[string]string{"wp": "UFFDIO_WRITEPROTECT", "backend": "UFFDIO_COPY", "prefetch_cache": "UFFDIO_COPY"}[a["farmem.fault.source"]]
			got := attrs(in.Attributes)["farmem.ioctl"]
			zeroOK := a["farmem.fault.source"] == "zero" && (got == "UFFDIO_COPY" || (got == "UFFDIO_ZEROPAGE" && a["farmem.fault.kind"] == "read"))
			if got != want && !zeroOK {
				t.Fatalf("install of a %s %s fault names ioctl %q", a["farmem.fault.kind"], a["farmem.fault.source"], got)
			}
		}
		if a["farmem.fault.source"] == "backend" {
			f, ok := stages["backend fetch"]
			if !ok {
				t.Fatalf("backend fault span has no backend fetch stage: %v", keys(stages))
			}
			fa := attrs(f.Attributes)
			if fa["farmem.bytes"] != "4096" || fa["farmem.transport"] == "" {
				t.Fatalf("backend fetch attributes %v: want farmem.bytes 4096 and a transport", fa)
			}
			backend++
		}
	}
	t.Logf("%d spans: %d faults (kinds %v, sources %v), %d with a backend fetch, %d eviction batches", len(spans), faults, kinds, sources, backend, evictions)
	if faults == 0 {
		t.Fatalf("no fault span")
	}
	if sampled && (backend == 0 || evictions == 0) {
		t.Fatalf("want fault spans with a backend fetch and eviction batch spans: %d and %d", backend, evictions)
	}
	for k := range kinds {
		if k != "read" && k != "write" && k != "wp" {
			t.Fatalf("fault kind %q", k)
		}
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Every fault traced (--trace-sample 1) over OTLP/gRPC: fault spans with their attributes and
// stages, eviction batches, Leap's prefetch batches as children of their fault; and the
// exported fault counts and duration histogram equal the run's summary, every metric named and
// unit-ed as the README says.
func TestOTLPGRPCTracesAndMetrics(t *testing.T) {
	addr, sink := startGRPCSink(t)
	_, sum := runMicroSummary(t, nil, "--otlp", addr, "--otlp-protocol", "grpc", "--trace-sample", "1", "--prefetch", "leap")
	checkFaultSpans(t, sink, "farmem", true)
	var pf int
	for _, sp := range sink.spans() {
		if sp.Name == "prefetch batch" && len(sp.ParentSpanId) > 0 {
			pf++
		}
	}
	if pf == 0 {
		t.Fatalf("no prefetch batch span under a fault (leap on a sequential walk)")
	}
	want := summaryFaults(sum)
	got := sink.lastSums("farmem.faults", "farmem.fault.source")
	hist := sink.lastHistogramCounts("farmem.fault.duration", "farmem.fault.source")
	t.Logf("summary %v; farmem.faults %v; farmem.fault.duration counts %v", want, got, hist)
	if want["backend"] == 0 {
		t.Fatalf("the run served no backend fault: the test does not page")
	}
	for _, src := range []string{"zero", "backend", "wp", "prefetch_cache"} {
		if got[src] != want[src] || int64(hist[src]) != want[src] {
			t.Errorf("source %s: summary %d, farmem.faults %d, farmem.fault.duration count %d", src, want[src], got[src], hist[src])
		}
	}
	ev := sink.lastSums("farmem.eviction.pages", "farmem.eviction.outcome")
	if ev["written"] != sum.Evicted.Written || ev["clean_dropped"] != sum.Evicted.DroppedClean {
		t.Errorf("farmem.eviction.pages %v, summary %+v", ev, sum.Evicted)
	}
	io := sink.lastSums("farmem.backend.io", "farmem.backend.io.direction")
	if io["write"] != sum.Evicted.Written*4096 || io["read"] < int64(want["backend"])*4096 {
		t.Errorf("farmem.backend.io %v: want write %d (the pages written) and read at least %d (the backend faults)", io, sum.Evicted.Written*4096, want["backend"]*4096)
	}
	units := sink.metricUnits()
	for name, unit := range map[string]string{"farmem.fault.duration": "s", "farmem.faults": "{fault}", "farmem.eviction.pages": "{page}",
		"farmem.eviction.batches": "{batch}", "farmem.prefetch.pages": "{page}", "farmem.backend.io": "By", "farmem.resident": "By",
		"farmem.resident.limit": "By", "farmem.backend.stored": "By", "farmem.backend.server.count": "{server}"} {
		if u, ok := units[name]; !ok || u != unit {
			t.Errorf("metric %s: unit %q (exported: %v), want %q", name, u, ok, unit)
		}
	}
	if limit := sink.lastGauge("farmem.resident.limit"); limit != 16<<20 {
		t.Errorf("farmem.resident.limit %d, want the 16 MiB cap in bytes", limit)
	}
	if r := sink.lastGauge("farmem.resident"); r < 0 || r%4096 != 0 || r > 16<<20 {
		t.Errorf("farmem.resident %d: want bytes, whole pages, within the cap", r)
	}
}

// The standard environment: the endpoint alone (http/protobuf, the specification's default),
// headers, service name and resource attributes; and the flags.
func TestOTLPHTTPAndEnvironment(t *testing.T) {
	t.Run("http-flags", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		runMicro(t, nil, "--otlp", addr, "--otlp-protocol", "http/protobuf", "--trace-sample", "0.2", "--quiet")
		checkFaultSpans(t, sink, "farmem", true)
		if len(sink.lastSums("farmem.faults", "farmem.fault.source")) == 0 {
			t.Fatalf("no farmem.faults metric over OTLP/HTTP")
		}
	})
	t.Run("http-env", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		runMicro(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_EXPORTER_OTLP_HEADERS=x-farmem-test=yes", "OTEL_SERVICE_NAME=farmem-ci",
			"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=ci"}, "--trace-sample", "0.2", "--quiet")
		checkFaultSpans(t, sink, "farmem-ci", true)
		if sp := sink.spans(); sp[0].res["deployment.environment"] != "ci" {
			t.Fatalf("OTEL_RESOURCE_ATTRIBUTES not honoured: resource %v", sp[0].res)
		}
		sink.mu.Lock()
		h := sink.headers[0].Get("X-Farmem-Test")
		sink.mu.Unlock()
		if h != "yes" {
			t.Fatalf("OTEL_EXPORTER_OTLP_HEADERS not sent")
		}
	})
	// No protocol set anywhere: spans and metrics arrive over http/protobuf (the sink speaks
	// nothing else).
	t.Run("endpoint-env-alone", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		runMicro(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr}, "--quiet")
		// The default sampling (0.1 %) and every fault over --trace-slow's 100us: some faults.
		checkFaultSpans(t, sink, "farmem", false)
		if len(sink.lastSums("farmem.faults", "farmem.fault.source")) == 0 {
			t.Fatalf("no farmem.faults metric over the default protocol")
		}
	})
	t.Run("endpoint-flag-alone", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		runMicro(t, nil, "--otlp", addr, "--quiet")
		checkFaultSpans(t, sink, "farmem", false)
	})
}

// Each OTEL_* variable farmem honours, against the in-test receivers: the sampler, the
// exporter selection, and each signal's own protocol and endpoint.
func TestOTelEnvironmentVariables(t *testing.T) {
	// spansAndMetrics runs micro with env (the endpoint named by the test), with every fault
	// traced unless the sampler says otherwise, and returns what sink got.
	run := func(t *testing.T, sink *otlpSink, env ...string) (spans, metrics int, out string) {
		t.Helper()
		out = runMicro(t, env, "--quiet")
		spans, metrics = sink.counts()
		t.Logf("%v: %d spans, %d metric exports", env, spans, metrics)
		return spans, metrics, out
	}
	httpEnv := func(addr string, kv ...string) []string {
		return append([]string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addr}, kv...)
	}
	t.Run("sampler-always-on", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		path := filepath.Join(t.TempDir(), "summary.json")
		out := runMicro(t, httpEnv(addr, "OTEL_TRACES_SAMPLER=always_on"), "--quiet", "--summary-json", path)
		var total int64
		for _, n := range summaryFaults(readSummary(t, path)) {
			total += n
		}
		var faults int64
		for _, sp := range sink.spans() {
			if sp.Name == "page fault" {
				faults++
				if s := attrs(sp.Attributes)["farmem.fault.sampled"]; s != "head" {
					t.Fatalf("always_on: a fault span sampled %q, want head", s)
				}
			}
		}
		t.Logf("always_on: %d fault spans, %d faults in the summary", faults, total)
		// Every fault is traced, unless the span goroutine fell behind (then it says so).
		if faults == 0 || (faults != total && !strings.Contains(out, "records were not traced")) {
			t.Fatalf("always_on: %d fault spans for %d faults", faults, total)
		}
	})
	for _, c := range []struct{ name, sampler, arg string }{
		{"sampler-always-off", "always_off", ""},
		{"sampler-parentbased-always-off", "parentbased_always_off", ""},
		{"sampler-ratio-0", "traceidratio", "0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, sink := startHTTPSink(t)
			spans, metrics, _ := run(t, sink, httpEnv(addr, "OTEL_TRACES_SAMPLER="+c.sampler, "OTEL_TRACES_SAMPLER_ARG="+c.arg)...)
			// The export works (the metrics arrived), but no fault was sampled, slow or not.
			if spans != 0 || metrics == 0 {
				t.Fatalf("OTEL_TRACES_SAMPLER=%s ARG=%q: %d spans, %d metric exports; want none and some", c.sampler, c.arg, spans, metrics)
			}
		})
	}
	t.Run("traces-exporter-none", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		spans, metrics, _ := run(t, sink, httpEnv(addr, "OTEL_TRACES_EXPORTER=none", "OTEL_TRACES_SAMPLER=always_on")...)
		if spans != 0 || metrics == 0 {
			t.Fatalf("OTEL_TRACES_EXPORTER=none: %d spans, %d metric exports; want none and some", spans, metrics)
		}
	})
	t.Run("metrics-exporter-none", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		spans, metrics, _ := run(t, sink, httpEnv(addr, "OTEL_METRICS_EXPORTER=none", "OTEL_TRACES_SAMPLER=always_on")...)
		if spans == 0 || metrics != 0 {
			t.Fatalf("OTEL_METRICS_EXPORTER=none: %d spans, %d metric exports; want some and none", spans, metrics)
		}
	})
	t.Run("console-exporters", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		spans, metrics, out := run(t, sink, httpEnv(addr, "OTEL_TRACES_EXPORTER=console", "OTEL_METRICS_EXPORTER=console", "OTEL_TRACES_SAMPLER=always_on")...)
		consoleSpans, consoleMetrics := strings.Contains(out, `"Name": "page fault"`), strings.Contains(out, `"Name": "farmem.fault.duration"`)
		if spans != 0 || metrics != 0 || !consoleSpans || !consoleMetrics {
			t.Fatalf("console exporters: %d spans and %d metric exports over OTLP (want none); on stdout page fault spans %v, farmem.fault.duration %v",
				spans, metrics, consoleSpans, consoleMetrics)
		}
	})
	t.Run("traces-console-metrics-otlp", func(t *testing.T) {
		addr, sink := startHTTPSink(t)
		spans, metrics, out := run(t, sink, httpEnv(addr, "OTEL_TRACES_EXPORTER=console", "OTEL_TRACES_SAMPLER=always_on")...)
		if spans != 0 || metrics == 0 || !strings.Contains(out, `"Name": "page fault"`) {
			t.Fatalf("OTEL_TRACES_EXPORTER=console: %d spans over OTLP (want none), %d metric exports, page fault spans on stdout: %v",
				spans, metrics, strings.Contains(out, `"Name": "page fault"`))
		}
	})
	// Traces over gRPC to one receiver, metrics over http/protobuf to another, each by its own
	// variables: a metrics exporter reading the traces' protocol would send gRPC to an HTTP
	// receiver and get nothing through.
	t.Run("protocol-per-signal", func(t *testing.T) {
		gaddr, gsink := startGRPCSink(t)
		haddr, hsink := startHTTPSink(t)
		for _, env := range [][]string{
			{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + gaddr, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc",
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=http://" + haddr + "/v1/metrics"},
			// The general variable says grpc; the metrics' own says http/protobuf.
			{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://" + gaddr, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc",
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=http://" + haddr + "/v1/metrics", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=http/protobuf"},
		} {
			gsink.reset()
			hsink.reset()
			runMicro(t, append(env, "OTEL_TRACES_SAMPLER=always_on"), "--quiet")
			gs, gm := gsink.counts()
			hs, hm := hsink.counts()
			t.Logf("%v: gRPC receiver %d spans, %d metric exports; HTTP receiver %d spans, %d metric exports", env, gs, gm, hs, hm)
			if gs == 0 || gm != 0 || hs != 0 || hm == 0 {
				t.Fatalf("want the spans over gRPC only and the metrics over HTTP only")
			}
		}
	})
}

// --metrics-addr (or OTEL_METRICS_EXPORTER=prometheus) serves the metrics while the program
// runs, under the Prometheus names the README gives, and farmem's pid as target_info's
// process_pid.
func TestMetricsAddrScrape(t *testing.T) {
	for _, how := range []string{"flag", "env"} {
		t.Run(how, func(t *testing.T) {
			port := freePort(t)
			args := []string{"run", "--local-mem", "16MiB", "--quiet"}
			env := cleanEnv()
			if how == "flag" {
				args = append(args, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", port))
			} else {
				env = append(env, "OTEL_METRICS_EXPORTER=prometheus", "OTEL_EXPORTER_PROMETHEUS_HOST=127.0.0.1", fmt.Sprintf("OTEL_EXPORTER_PROMETHEUS_PORT=%d", port))
			}
			cmd := exec.Command(farmemBin(t), append(args, "--", filepath.Join(binDir, "micro"), "--mib", "40", "--pattern", "random", "--passes", "3")...)
			cmd.Env = env
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			re := mustCompile(`(?m)^farmem_fault_duration_seconds_count\{[^}]*farmem_fault_source="backend"[^}]*\} ([0-9]+)`)
			var page string
			for {
				select {
				case err := <-done:
					t.Fatalf("farmem exited (%v) before /metrics showed backend faults; last scrape:\n%s\n%s", err, page, out.String())
				case <-time.After(200 * time.Millisecond):
				}
				resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
				if err != nil {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				page = string(b)
				if m := re.FindStringSubmatch(page); m != nil && m[1] != "0" {
					for _, want := range []string{`farmem_fault_duration_seconds_bucket{`, `le="0.0001"`, `farmem_faults_total{`,
						`farmem_eviction_pages_total{`, `farmem_eviction_pages_total{farmem_eviction_outcome="written"`, `farmem_eviction_batches_total`,
						`farmem_prefetch_pages_total{`, `farmem_backend_io_bytes_total{farmem_backend_io_direction="read"`,
						`farmem_resident_bytes{`, `farmem_resident_limit_bytes{`, `farmem_backend_stored_bytes{`,
						`farmem_backend_server_count{farmem_backend_server_state="up"`,
						fmt.Sprintf(`process_pid="%d"`, cmd.Process.Pid)} {
						if !strings.Contains(page, want) {
							t.Fatalf("/metrics has no %s:\n%s", want, page)
						}
					}
					limit := mustCompile(`(?m)^farmem_resident_limit_bytes\{[^}]*\} (\S+)`).FindStringSubmatch(page)
					if v, err := strconv.ParseFloat(limit[1], 64); err != nil || v != 16<<20 {
						t.Fatalf("farmem_resident_limit_bytes %q, want the 16 MiB cap in bytes", limit[1])
					}
					t.Logf("backend faults so far: %s", m[1])
					break
				}
			}
			if err := <-done; err != nil || !strings.Contains(out.String(), "micro: OK bad=0") {
				t.Fatalf("micro under farmem failed: %v\n%s", err, out.String())
			}
		})
	}
}

// Bad telemetry input is a one-line usage error (status 125, nothing started); an endpoint that
// does not answer is warned about once and the program runs to the end.
func TestTelemetryBadInput(t *testing.T) {
	micro := filepath.Join(binDir, "micro")
	for _, c := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--otlp", "127.0.0.1:4317", "--otlp-protocol", "thrift"}, nil, `--otlp-protocol "thrift": give grpc or http/protobuf`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
			`OTEL_EXPORTER_OTLP_PROTOCOL="http/json": farmem's OTLP exporters speak grpc or http/protobuf, not http/json`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=udp"},
			`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="udp": give grpc or http/protobuf`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=thrift"},
			`OTEL_EXPORTER_OTLP_METRICS_PROTOCOL="thrift": give grpc or http/protobuf`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER=sometimes"},
			`OTEL_TRACES_SAMPLER="sometimes": give always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER=jaeger_remote"}, `OTEL_TRACES_SAMPLER="jaeger_remote": farmem has no remote sampler`},
		{nil, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER=traceidratio", "OTEL_TRACES_SAMPLER_ARG=half"},
			`OTEL_TRACES_SAMPLER_ARG="half": give a ratio from 0 to 1 for traceidratio`},
		{nil, []string{"OTEL_TRACES_EXPORTER=jaeger"}, `OTEL_TRACES_EXPORTER="jaeger": farmem exports to otlp, console or none`},
		{nil, []string{"OTEL_METRICS_EXPORTER=statsd"}, `OTEL_METRICS_EXPORTER="statsd": farmem exports to otlp, console, prometheus or none`},
		{[]string{"--trace-sample", "1.5"}, nil, "--trace-sample 1.5: give a ratio from 0 to 1"},
		{[]string{"--trace-sample", "most"}, nil, `--trace-sample "most": give a ratio from 0 to 1`},
		{[]string{"--trace-slow", "fast"}, nil, `--trace-slow "fast": give a duration`},
		{[]string{"--latency-out", "/nonexistent-farmem-dir/lat.csv"}, nil, "--latency-out: open /nonexistent-farmem-dir/lat.csv"},
		{[]string{"--summary-json", "/nonexistent-farmem-dir/s.json"}, nil, "--summary-json: open /nonexistent-farmem-dir/s.json"},
		{[]string{"--trace-slow-max", "-5"}, nil, "--trace-slow-max -5: give a number of faults a second"},
		{[]string{"--stats", "0s"}, nil, `--stats "0s": give an interval`},
		{[]string{"--otlp", "localhost"}, nil, `--otlp "localhost": give HOST:PORT`},
		{[]string{"--metrics-addr", "9464"}, nil, `--metrics-addr "9464": give HOST:PORT`},
	} {
		cmd := exec.Command(farmemBin(t), append(append([]string{"run", "--local-mem", "16MiB"}, c.args...), "--", micro, "--mib", "1")...)
		cmd.Env = append(cleanEnv(), c.env...)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 125 || !strings.Contains(string(out), c.want) || strings.Contains(string(out), "micro:") ||
			strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
			t.Errorf("%v %v: exit %v, output %q; want status 125 and the one line %q, program not started", c.args, c.env, err, out, c.want)
		}
	}
	// A port already taken for --metrics-addr fails before the program starts.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, err := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--metrics-addr", ln.Addr().String(), "--", micro, "--mib", "1").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 125 || !strings.Contains(string(out), "--metrics-addr "+ln.Addr().String()) {
		t.Errorf("--metrics-addr on a taken port: %v %q", err, out)
	}
	// Nothing listens on the endpoint: the run completes and says so once.
	for _, proto := range []string{"grpc", "http/protobuf"} {
		dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		out := runMicro(t, nil, "--otlp", dead, "--otlp-protocol", proto, "--trace-sample", "1")
		// The export warning, once (a line that sampled records were dropped may come too).
		if n := strings.Count(out, "further telemetry errors are not shown"); n != 1 {
			t.Errorf("%s endpoint %s down: %d telemetry warnings, want exactly 1:\n%s", proto, dead, n, out)
		}
		if !strings.Contains(out, "farmem: held micro to 16 MiB") {
			t.Errorf("no summary after a run whose collector was down")
		}
	}
	// The default protocol, http/protobuf, sent to a gRPC collector on 4317 (the likely mistake
	// of a user used to grpc as the default): the one warning says why nothing got through.
	ln, err = net.Listen("tcp", "127.0.0.1:4317")
	if err != nil {
		t.Logf("port 4317 is taken (%v): the warning's hint is not checked end to end", err)
		return
	}
	addr, sink := serveGRPCSink(t, ln)
	out = []byte(runMicro(t, nil, "--otlp", addr, "--trace-sample", "1"))
	if n := strings.Count(string(out), "further telemetry errors are not shown"); n != 1 || !strings.Contains(string(out), "port 4317 is OTLP/gRPC's: give --otlp-protocol grpc") {
		t.Errorf("http/protobuf by default to a gRPC collector on 4317: %d warnings, want one naming the protocol:\n%s", n, out)
	}
	if spans, metrics := sink.counts(); spans+metrics != 0 {
		t.Errorf("the gRPC collector got %d spans and %d metric exports over http/protobuf", spans, metrics)
	}
}

// --latency-out holds every fault and every eviction batch: its counts by source are the
// summary's, and --quiet does not turn it off.
func TestLatencyOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lat.csv")
	_, sum := runMicroSummary(t, nil, "--prefetch", "none", "--latency-out", path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if lines[0] != "what,lower_ns,upper_ns,count" {
		t.Fatalf("--latency-out header %q", lines[0])
	}
	counts := map[string]int64{}
	for _, l := range lines[1:] {
		f := strings.Split(l, ",")
		if len(f) != 4 {
			t.Fatalf("--latency-out line %q", l)
		}
		lo, _ := strconv.ParseInt(f[1], 10, 64)
		hi, _ := strconv.ParseInt(f[2], 10, 64)
		n, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil || n <= 0 || hi <= lo {
			t.Fatalf("--latency-out line %q: want lower < upper and a positive count", l)
		}
		counts[f[0]] += n
	}
	m, ev := int64(sum.Faults["backend"].Count), sum.Batches.Count
	if m == 0 || ev == 0 || counts["backend"] != m || counts["eviction-batch"] != ev {
		t.Fatalf("--latency-out counts %v, the summary's backend faults %d and batches %d", counts, m, ev)
	}
	// The faults held before service: the summary's count of each reason is the file's.
	for _, why := range []string{"room", "busy", "event"} {
		if got, want := counts["held-"+why], int64(sum.Held[why].Count); got != want {
			t.Fatalf("--latency-out holds %d faults held for %s, the summary %d", got, why, want)
		}
	}
	os.Remove(path)
	runMicro(t, nil, "--quiet", "--latency-out", path)
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), "\nbackend,") {
		t.Fatalf("--quiet run: --latency-out %q, %v", b, err)
	}
}

// farmem run --help lists the OTEL_* variables it honours and the default protocol.
func TestRunHelpNamesOTelVariables(t *testing.T) {
	out, code := runApp("run", "--help")
	for _, want := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
		"http/protobuf (the default", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL and _METRICS_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
		"OTEL_TRACES_SAMPLER, _ARG", "always_off", "traceidratio", "OTEL_SERVICE_NAME", "OTEL_SDK_DISABLED", "exit 125"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("farmem run --help (exit %d) does not name %q", code, want)
		}
	}
}
