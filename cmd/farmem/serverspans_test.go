package main

// End to end: a memory server's spans of the reads a sampled page fault makes join the client's
// trace. A ctrl, a memory server and farmem run, both exporting to one in-test OTLP receiver.

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

// Every fault traced (--trace-sample 1) over tcp: the memory server's "memserver read" spans
// (service farmem-memserver) are children of farmem's "backend fetch" spans (service farmem),
// in the same traces, under their "page fault" spans; and the fetch span names the server that
// answered. Both export by the default protocol, http/protobuf.
func TestMemserverSpansJoinFaultTrace(t *testing.T) {
	if err := checkUserfaultfd(); err != nil {
		t.Skip(err)
	}
	clearOTelEnv(t)
	sinkAddr, sink := startHTTPSink(t)
	addr, tok, mem, _ := startTracedCluster(t, sinkAddr)

	args, summary := summarized(t, []string{"run", "--ctrl", addr, "--token-file", tok, "--otlp", sinkAddr, "--trace-sample", "1",
		"--local-mem", "16MiB", "--", filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "random", "--passes", "1"})
	cmd := exec.Command(farmemBin(t), args...)
	cmd.Env = cleanEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("farmem run:\n%s", lastLines(out.String(), 8))
	if err != nil || !strings.Contains(out.String(), "micro: OK bad=0") {
		t.Fatalf("micro under farmem over tcp failed: %v", err)
	}

	// farmem run flushed its spans at exit; the memory server exports in batches (a second).
	// Every backend fault was traced, and its read: the server's spans keep coming until it has
	// exported one per backend fault.
	backendFaults := int(summary().Faults["backend"].Count)
	if backendFaults == 0 {
		t.Fatalf("the run served no backend fault: the test does not page")
	}
	var joined, serverReads int
	var why string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		joined, serverReads, why = joinedReads(sink.spans(), mem)
		if serverReads >= backendFaults || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("%d backend faults; %d memserver read spans, %d of them children of a backend fetch span of farmem's", backendFaults, serverReads, joined)
	if joined == 0 {
		t.Fatalf("no memserver read span joined a fault's trace: %s", why)
	}
	// A read whose fault's spans were dropped (farmem's span worker behind: it says so) has no
	// parent to join; otherwise a fault's every read names its fetch span, retries included.
	if !strings.Contains(out.String(), "records were not traced") && joined < serverReads*9/10 {
		t.Fatalf("only %d of %d memserver read spans joined a fault's trace: %s", joined, serverReads, why)
	}

	// A sequential walk over tcp: leap's prefetches go through the memory-server prefetch
	// worker, whose "prefetch batch" spans (roots of their own traces) link to the fault that
	// predicted them and have the batched read as a stage.
	before := len(sink.spans())
	cmd = exec.Command(farmemBin(t), "run", "--ctrl", addr, "--token-file", tok, "--otlp", sinkAddr, "--trace-sample", "1",
		"--local-mem", "16MiB", "--", filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "seq", "--passes", "1")
	cmd.Env = cleanEnv()
	out.Reset()
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil || !strings.Contains(out.String(), "micro: OK bad=0") {
		t.Fatalf("micro seq under farmem over tcp failed: %v\n%s", err, lastLines(out.String(), 8))
	}
	spans := sink.spans()[before:]
	byID := map[string]span{}
	children := map[string][]string{}
	for _, sp := range spans {
		byID[string(sp.SpanId)] = sp
		children[string(sp.ParentSpanId)] = append(children[string(sp.ParentSpanId)], sp.Name)
	}
	var batches, linked int
	for _, sp := range spans {
		if sp.res["service.name"] != "farmem" || sp.Name != "prefetch batch" || len(sp.ParentSpanId) != 0 {
			continue // the inline prefetch of a fault is its child, not the worker's root span
		}
		batches++
		a := attrs(sp.Attributes)
		if n, _ := strconv.Atoi(a["farmem.prefetch.pages"]); n <= 0 || a["farmem.prefetch.trigger"] == "" {
			t.Fatalf("prefetch batch span attributes %v", a)
		}
		if st := strings.Join(children[string(sp.SpanId)], ","); st != "backend fetch,install" && st != "install,backend fetch" {
			t.Fatalf("prefetch batch span stages %q, want backend fetch and install", st)
		}
		for _, l := range sp.Links {
			f, ok := byID[string(l.SpanId)]
			if ok && f.Name == "page fault" && bytes.Equal(f.TraceId, l.TraceId) && attrs(f.Attributes)["farmem.page.address"] == a["farmem.prefetch.trigger"] {
				linked++
			}
		}
	}
	t.Logf("sequential walk: %d prefetch worker batch spans, %d linked to the fault that predicted them", batches, linked)
	if batches == 0 || linked == 0 {
		t.Fatalf("want prefetch worker batch spans linked to their faults: %d batches, %d linked\n%s", batches, linked, lastLines(out.String(), 8))
	}
}

// startTracedCluster starts a ctrl and one memory server exporting its spans to sinkAddr, with
// the test's environment (OTEL_* set by the caller), and waits for the server to be up. It
// returns the ctrl's address, the token file, the memory server's address and its process.
func startTracedCluster(t *testing.T, sinkAddr string) (addr, tok, mem string, server *exec.Cmd) {
	t.Helper()
	dir := t.TempDir()
	tok = writeToken(t, dir, "the-right-cluster-token-0123456789")
	addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startLogged(t, "ctrl", farmemBin(t), "ctrl", "--listen", addr, "--state", filepath.Join(dir, "ctrl"), "--token-file", tok, "--slab-size", "4MiB")
	dialRetry(t, mustPort(t, addr)).Close()
	mem = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	server, memLog := startLogged(t, "memserver", farmemBin(t), "memserver", "--listen", mem, "--capacity", "256MiB", "--ctrl", addr,
		"--token-file", tok, "--otlp", sinkAddr)
	tk, err := fabric.LoadToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, _ := ctrl.NewClient(addr, tk).Status(ctx)
		cancel()
		if len(st.Servers) == 1 && st.Servers[0].Healthy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the memory server never came up: %+v", st)
		}
	}
	if want := "a span of each traced request goes to " + sinkAddr + " over OTLP (http/protobuf)"; !strings.Contains(memLog.String(), want) {
		t.Errorf("the memory server does not say where its spans go (%q):\n%s", want, memLog.String())
	}
	return addr, tok, mem, server
}

// clearOTelEnv unsets every OTEL_* variable for the test: a developer's must not redirect or
// rename the spans of the processes the test starts with its environment.
func clearOTelEnv(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
		}
	}
}

// OTEL_TRACES_SAMPLER=always_off on a memory server: it exports no span, though every fault of
// the client is traced (and its read carries a sampled context).
func TestMemserverSamplerOff(t *testing.T) {
	if err := checkUserfaultfd(); err != nil {
		t.Skip(err)
	}
	clearOTelEnv(t)
	t.Setenv("OTEL_TRACES_SAMPLER", "always_off")
	sinkAddr, sink := startHTTPSink(t)
	addr, tok, _, memserver := startTracedCluster(t, sinkAddr)
	cmd := exec.Command(farmemBin(t), "run", "--ctrl", addr, "--token-file", tok, "--otlp", sinkAddr, "--trace-sample", "1",
		"--local-mem", "16MiB", "--", filepath.Join(binDir, "micro"), "--mib", "48", "--pattern", "random", "--passes", "1")
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "micro: OK bad=0") {
		t.Fatalf("micro under farmem over tcp failed: %v\n%s", err, lastLines(string(out), 8))
	}
	// A memory server stopped by SIGTERM exports every span it made before it exits.
	memserver.Process.Signal(syscall.SIGTERM)
	if err := memserver.Wait(); err != nil {
		t.Fatalf("the memory server on SIGTERM: %v", err)
	}
	var fetches, server int
	for _, sp := range sink.spans() {
		switch {
		case sp.res["service.name"] == "farmem-memserver":
			server++
		case sp.Name == "backend fetch":
			fetches++
		}
	}
	t.Logf("farmem's backend fetch spans %d; the memory server's spans %d", fetches, server)
	if fetches == 0 || server != 0 {
		t.Fatalf("OTEL_TRACES_SAMPLER=always_off on the memory server: %d of its spans (want none) beside %d backend fetch spans of farmem's", server, fetches)
	}
}

// joinedReads counts the memory server's read spans whose parent is one of farmem's backend
// fetch spans, in the same trace, itself the child of a page fault span; why says what was
// missing when none is.
func joinedReads(spans []span, mem string) (joined, reads int, why string) {
	byID := map[string]span{}
	for _, sp := range spans {
		byID[string(sp.SpanId)] = sp
	}
	why = "no memserver read span from service farmem-memserver"
	for _, sp := range spans {
		if sp.res["service.name"] != "farmem-memserver" || sp.Name != "memserver read" {
			continue
		}
		reads++
		a := attrs(sp.Attributes)
		if sp.Kind != tracepb.Span_SPAN_KIND_SERVER || a["farmem.pages"] != "1" || a["farmem.bytes"] != "4096" ||
			a["farmem.status"] != "ok" || len(a["farmem.session"]) != 32 || a["farmem.slab"] == "" {
			why = fmt.Sprintf("memserver read span of kind %v with attributes %v", sp.Kind, a)
			return 0, reads, why
		}
		fetch, ok := byID[string(sp.ParentSpanId)]
		if !ok {
			why = fmt.Sprintf("the parent %s of a memserver read span is not among the %d spans exported", hex.EncodeToString(sp.ParentSpanId), len(spans))
			continue
		}
		fa := attrs(fetch.Attributes)
		switch {
		case fetch.res["service.name"] != "farmem" || fetch.Name != "backend fetch":
			why = fmt.Sprintf("a memserver read span's parent is %q of service %q", fetch.Name, fetch.res["service.name"])
		case !bytes.Equal(fetch.TraceId, sp.TraceId):
			why = "a memserver read span is in another trace than its parent backend fetch"
		case byID[string(fetch.ParentSpanId)].Name != "page fault" || !bytes.Equal(byID[string(fetch.ParentSpanId)].TraceId, sp.TraceId):
			why = "a backend fetch span with a memserver child is not under a page fault span of its trace"
		case fa["server.address"] != mem || fa["farmem.transport"] != "tcp" || fa["farmem.replica"] != "0":
			why = fmt.Sprintf("the backend fetch span names %v, not the memory server %s over tcp that answered", fa, mem)
		default:
			joined++
		}
	}
	return joined, reads, why
}

// Bad --otlp input to farmem memserver is a usage error, before it listens.
func TestMemserverOTLPBadInput(t *testing.T) {
	dir := t.TempDir()
	tok := writeToken(t, dir, "the-right-cluster-token-0123456789")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--otlp", "localhost"}, `--otlp "localhost": give HOST:PORT`},
		{[]string{"--otlp", "127.0.0.1:4317", "--otlp-protocol", "thrift"}, `--otlp-protocol "thrift": give grpc or http/protobuf`},
		{[]string{"--otlp", ""}, "--otlp is empty"},
	} {
		args := append([]string{"memserver", "--ctrl", "127.0.0.1:1", "--token-file", tok, "--capacity", "64MiB",
			"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, c.args...)
		cmd := exec.Command(farmemBin(t), args...)
		cmd.Env = cleanEnv()
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != 125 || !strings.Contains(string(out), c.want) {
			t.Errorf("farmem %s: exit %d, output %q; want exit 125 and %q", strings.Join(args, " "), code, out, c.want)
		}
	}
}
