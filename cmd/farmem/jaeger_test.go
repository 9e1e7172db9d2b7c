package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// jaegerBin is Jaeger v2, built from its Go module by .ci/run (FARMEM_JAEGER names it).
func jaegerBin(t *testing.T) string {
	t.Helper()
	p := os.Getenv("FARMEM_JAEGER")
	if p == "" {
		p = "/var/cache/farmem-jaeger/jaeger-v1.76.0"
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("FARMEM_SKIP_JAEGER") != "" {
			t.Skipf("no Jaeger binary at %s and FARMEM_SKIP_JAEGER is set: the real-receiver test is skipped", p)
		}
		t.Fatalf("no Jaeger binary at %s: .ci/run builds it (go mod download github.com/jaegertracing/jaeger@v1.76.0, then go build ./cmd/jaeger in that module's directory); set FARMEM_JAEGER to its path, or FARMEM_SKIP_JAEGER=1 to skip this test", p)
	}
	return p
}

// jaegerTrace is what Jaeger's query API (/api/traces) returns for a trace.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
		Tags []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
		ProcessID string `json:"processID"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
		Tags        []struct {
			Key   string `json:"key"`
			Value any    `json:"value"`
		} `json:"tags"`
	} `json:"processes"`
}

// A real receiver: Jaeger v2 (all-in-one, in-memory storage) on loopback gets the traces of a
// capped redis-server run over OTLP, by the default protocol (http/protobuf: Jaeger listens for
// nothing else here), and its query API returns fault spans of service farmem, with their
// attributes and stages, the program's pid on them and farmem's on the resource.
func TestJaegerReceivesRedisFaultSpans(t *testing.T) {
	jaeger := jaegerBin(t)
	need(t, "redis-server")
	otlpPort, queryPort, grpcPort := freePort(t), freePort(t), freePort(t)
	cfg := filepath.Join(t.TempDir(), "jaeger.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:%d
processors:
  batch:
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, queryPort, grpcPort, otlpPort)), 0o644)
	j := exec.Command(jaeger, "--config", cfg)
	var jlog bytes.Buffer
	j.Stdout, j.Stderr = &jlog, &jlog
	if err := j.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		j.Process.Kill()
		j.Wait()
		if t.Failed() {
			t.Logf("jaeger's log:\n%s", lastLines(jlog.String(), 30))
		}
	}()
	query := func(path string, v any) error {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", queryPort, path))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			return fmt.Errorf("%s: %s: %s", path, resp.Status, b)
		}
		return json.Unmarshal(b, v)
	}
	for i := 0; ; i++ {
		var s struct{ Data []string }
		if query("/api/services", &s) == nil {
			break
		}
		if i > 300 {
			t.Fatalf("Jaeger's query API on port %d never answered", queryPort)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A capped redis: populate, then read every key back through the fault path.
	port := freePort(t)
	args, summary := summarized(t, []string{"run", "--local-mem", "24MiB", "--otlp", fmt.Sprintf("127.0.0.1:%d", otlpPort), "--trace-sample", "0.05", "--",
		"redis-server", "--port", strconv.Itoa(port), "--save", "", "--appendonly", "no", "--enable-debug-command", "yes",
		"--dir", t.TempDir(), "--bind", "127.0.0.1"})
	cmd := exec.Command(farmemBin(t), args...)
	cmd.Env = cleanEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := dialRedis(t, port)
	const keys = 120000
	r.must(t, "DEBUG", "POPULATE", strconv.Itoa(keys), "key", "200")
	d0 := r.must(t, "DEBUG", "DIGEST")
	for i := 0; i < keys; i += 1000 {
		args := []string{"MGET"}
		for k := i; k < i+1000; k++ {
			args = append(args, fmt.Sprintf("key:%d", k))
		}
		r.must(t, args...)
	}
	if d1 := r.must(t, "DEBUG", "DIGEST"); d1 != d0 {
		t.Fatalf("DEBUG DIGEST changed under tracing: %s then %s", d0, d1)
	}
	r.send("SHUTDOWN", "NOSAVE")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("farmem: %v\n%s", err, out.String())
	}
	t.Logf("farmem: %s", lastLines(out.String(), 6))
	if summary().Faults["backend"].Count == 0 {
		t.Fatalf("redis took no backend fault: the test does not page")
	}

	// Jaeger stores what its batch processor hands on: poll until the fault spans are there.
	var traces struct{ Data []jaegerTrace }
	q := "/api/traces?" + url.Values{"service": {"farmem"}, "operation": {"page fault"}, "limit": {"200"}, "lookback": {"1h"}}.Encode()
	var faults, backend, fetch int
	for i := 0; ; i++ {
		traces.Data = nil
		if err := query(q, &traces); err != nil {
			t.Fatalf("query %s: %v", q, err)
		}
		faults, backend, fetch = 0, 0, 0
		for _, tr := range traces.Data {
			parent := map[string]string{}
			for _, sp := range tr.Spans {
				for _, ref := range sp.References {
					if ref.RefType == "CHILD_OF" {
						parent[sp.SpanID] = ref.SpanID
					}
				}
			}
			for _, sp := range tr.Spans {
				if tr.Processes[sp.ProcessID].ServiceName != "farmem" {
					t.Fatalf("span %q of service %q", sp.OperationName, tr.Processes[sp.ProcessID].ServiceName)
				}
				tags := map[string]string{}
				for _, tg := range sp.Tags {
					tags[tg.Key] = fmt.Sprint(tg.Value)
				}
				switch sp.OperationName {
				case "page fault":
					faults++
					if tags["process.pid"] == "" || !strings.HasPrefix(tags["farmem.page.address"], "0x") || tags["farmem.fault.kind"] == "" {
						t.Fatalf("fault span without its attributes: %v", tags)
					}
					res := map[string]string{}
					for _, tg := range tr.Processes[sp.ProcessID].Tags {
						res[tg.Key] = fmt.Sprint(tg.Value)
					}
					if res["process.pid"] != strconv.Itoa(cmd.Process.Pid) || tags["process.pid"] == res["process.pid"] {
						t.Fatalf("fault span's process.pid %s, its resource's %s: want the program's and farmem's (%d)", tags["process.pid"], res["process.pid"], cmd.Process.Pid)
					}
					if tags["farmem.fault.source"] == "backend" {
						backend++
					}
				case "backend fetch":
					if tags["farmem.bytes"] != "4096" {
						t.Fatalf("backend fetch span with tags %v", tags)
					}
					if _, ok := parent[sp.SpanID]; ok {
						fetch++
					}
				}
			}
		}
		if backend > 0 && fetch > 0 {
			break
		}
		if i > 100 {
			t.Fatalf("after 20 s Jaeger has %d traces, %d fault spans, %d from the backend, %d backend fetch stages", len(traces.Data), faults, backend, fetch)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("Jaeger returned %d traces: %d fault spans, %d served from the backend, %d backend fetch stages", len(traces.Data), faults, backend, fetch)
}
