package telemetry

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/farmem/farmem/fabric"
)

// A traced request becomes a server span that is the child of the client's span it carried, in
// the client's trace, with what the server did; a refusal is an error span.
func TestServerSpanJoinsTheClientsTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
		sdktrace.WithIDGenerator(presetIDGenerator{}))
	defer tp.Shutdown(context.Background())
	st := &ServerTelemetry{tp: tp, tr: tp.Tracer("test"), ch: make(chan serverItem, 8), warn: func(string) {}}
	go st.loop()
	tc := fabric.TraceContext{TraceID: [16]byte{0xaa, 1}, SpanID: [8]byte{0xbb, 2}, Flags: 1}
	start := time.Now()
	sess := fabric.NewSessionID()
	st.Trace(&fabric.TracedRequest{Context: tc, Op: fabric.OpRead, Session: sess, Peer: "127.0.0.1:5000",
		Start: start, End: start.Add(20 * time.Microsecond), Pages: 1, Slab: 7, Slabs: 1})
	st.Trace(&fabric.TracedRequest{Context: tc, Op: fabric.OpWrite, Session: sess, Start: start, End: start.Add(time.Microsecond),
		Pages: 2, Slab: 9, Status: fabric.StatusNoSlab, Message: "no slab 9 for this session"})
	unsampled := tc
	unsampled.Flags = 0
	st.Trace(&fabric.TracedRequest{Context: unsampled, Op: fabric.OpRead, Start: start, End: start})
	st.flush()

	spans := exp.GetSpans()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2 (the unsampled context is not recorded)", len(spans))
	}
	r, w := spans[0], spans[1]
	if r.Name != "memserver read" || w.Name != "memserver write" || r.SpanKind != trace.SpanKindServer {
		t.Fatalf("spans %q (kind %v) and %q", r.Name, r.SpanKind, w.Name)
	}
	if r.SpanContext.TraceID() != trace.TraceID(tc.TraceID) || r.Parent.SpanID() != trace.SpanID(tc.SpanID) || !r.Parent.IsRemote() {
		t.Fatalf("the read span is in trace %v under %v (remote %v); the request carried %x/%x",
			r.SpanContext.TraceID(), r.Parent.SpanID(), r.Parent.IsRemote(), tc.TraceID, tc.SpanID)
	}
	if !r.StartTime.Equal(start) || !r.EndTime.Equal(start.Add(20*time.Microsecond)) {
		t.Fatalf("the read span runs %v to %v", r.StartTime, r.EndTime)
	}
	got := map[string]string{}
	for _, a := range r.Attributes {
		got[string(a.Key)] = a.Value.Emit()
	}
	for k, v := range map[string]string{"farmem.pages": "1", "farmem.bytes": "4096", "farmem.slab": "7", "farmem.slabs": "1",
		"farmem.session": sess.String(), "client.address": "127.0.0.1:5000", "farmem.status": "ok"} {
		if got[k] != v {
			t.Errorf("read span: %s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if r.Status.Code == codes.Error || w.Status.Code != codes.Error || w.Status.Description != "no slab 9 for this session" {
		t.Fatalf("statuses: read %+v, refused write %+v", r.Status, w.Status)
	}
}
