package telemetry

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fetcher"
)

// The ids a head-sampled fault was given before its fetch are the ones its spans get: the
// fault span's trace id and the backend fetch span's id (what a memory server names as its
// span's parent), with the copy that answered; every other span gets fresh random ids.
func TestFaultSpansTakeThePresetIDs(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithIDGenerator(presetIDGenerator{}))
	defer tp.Shutdown(context.Background())
	w := newSpanWorker(tp.Tracer("test"), Config{Sample: 1})
	read := time.Now()
	head := fetcher.FaultRecord{Pid: 7, Addr: 0x7f0000001000, Kind: fetcher.KindRead, Source: fetcher.FromBackend, Head: true,
		Read: read, Begin: time.Microsecond, Lookup: 2 * time.Microsecond, Fetch: 40 * time.Microsecond, Install: 41 * time.Microsecond,
		End: 42 * time.Microsecond, Pages: 1, Slot: 9,
		TraceID: [16]byte{0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, FetchSpan: [8]byte{0xbb, 1, 2, 3, 4, 5, 6, 7},
		From: backend.LoadedFrom{Server: "10.0.0.7:7070", Transport: "tcp", Replica: 1}}
	slow := head
	slow.Head, slow.TraceID, slow.FetchSpan, slow.From = false, [16]byte{}, [8]byte{}, backend.LoadedFrom{}
	w.Fault(&head)
	w.Fault(&slow)
	w.flush()

	spans := exp.GetSpans()
	var faults, fetches []tracetest.SpanStub
	for _, s := range spans {
		switch s.Name {
		case "page fault":
			faults = append(faults, s)
		case "backend fetch":
			fetches = append(fetches, s)
		}
	}
	if len(faults) != 2 || len(fetches) != 2 {
		t.Fatalf("%d fault and %d fetch spans, want 2 and 2 (of %d spans)", len(faults), len(fetches), len(spans))
	}
	f, fetch := faults[0], fetches[0]
	if f.SpanContext.TraceID() != trace.TraceID(head.TraceID) {
		t.Fatalf("the fault span's trace is %v, the fault was given %x", f.SpanContext.TraceID(), head.TraceID)
	}
	if fetch.SpanContext.SpanID() != trace.SpanID(head.FetchSpan) || fetch.Parent.SpanID() != f.SpanContext.SpanID() ||
		fetch.SpanContext.TraceID() != f.SpanContext.TraceID() {
		t.Fatalf("the fetch span is %v (parent %v), the fault gave %x under fault span %v",
			fetch.SpanContext.SpanID(), fetch.Parent.SpanID(), head.FetchSpan, f.SpanContext.SpanID())
	}
	want := map[attribute.Key]attribute.Value{"server.address": attribute.StringValue("10.0.0.7:7070"),
		"farmem.transport": attribute.StringValue("tcp"), "farmem.replica": attribute.IntValue(1)}
	for _, a := range fetch.Attributes {
		if v, ok := want[a.Key]; ok && v == a.Value {
			delete(want, a.Key)
		}
	}
	if len(want) != 0 {
		t.Fatalf("the fetch span lacks %v (it has %v)", want, fetch.Attributes)
	}
	seen := map[trace.SpanID]bool{}
	for _, s := range spans {
		id := s.SpanContext.SpanID()
		if seen[id] || !id.IsValid() {
			t.Fatalf("span %q has id %v, taken already or invalid", s.Name, id)
		}
		seen[id] = true
	}
	sf := faults[1]
	if !sf.SpanContext.TraceID().IsValid() || sf.SpanContext.TraceID() == f.SpanContext.TraceID() || fetches[1].SpanContext.SpanID() == fetch.SpanContext.SpanID() {
		t.Fatalf("the slow fault, given no ids, is in trace %v (fetch %v)", sf.SpanContext.TraceID(), fetches[1].SpanContext.SpanID())
	}
}
