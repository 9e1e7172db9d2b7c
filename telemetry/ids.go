package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
)

// presetIDGenerator is the TracerProvider's sdktrace.IDGenerator. The fault path gives a
// head-sampled fault its trace id and its backend fetch's span id before the fetch, so that the
// read can carry them to a memory server (fetcher/tracing.go); the spans are made afterwards,
// here, and must get exactly those ids, or the memory server's span would name a parent that
// does not exist. The SDK has no option to start a span with given ids, but it asks its
// IDGenerator with the context Start was given: the span worker puts the ids in that context
// (withPresetIDs) and this generator returns them. Everything else gets random ids.
type presetIDGenerator struct{}

type presetKey struct{}

// presetIDs are the ids the next span started with this context takes (zero: a random one).
type presetIDs struct {
	traceID trace.TraceID // for a root span
	spanID  trace.SpanID
}

// withPresetIDs makes the span started next with ctx take ids (the zero ones random).
func withPresetIDs(ctx context.Context, ids presetIDs) context.Context {
	return context.WithValue(ctx, presetKey{}, ids)
}

// NewIDs implements sdktrace.IDGenerator: a root span's trace and span ids.
func (presetIDGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	ids, _ := ctx.Value(presetKey{}).(presetIDs)
	if !ids.traceID.IsValid() {
		ids.traceID = randomTraceID()
	}
	if !ids.spanID.IsValid() {
		ids.spanID = randomSpanID()
	}
	return ids.traceID, ids.spanID
}

// NewSpanID implements sdktrace.IDGenerator: a child span's id.
func (presetIDGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if ids, ok := ctx.Value(presetKey{}).(presetIDs); ok && ids.spanID.IsValid() {
		return ids.spanID
	}
	return randomSpanID()
}

// randomTraceID and randomSpanID draw from math/rand/v2's runtime generator (ChaCha8 per
// thread, seeded from the kernel): safe from every goroutine with no lock, like the SDK's own.
func randomTraceID() trace.TraceID {
	var id trace.TraceID
	for !id.IsValid() {
		binary.LittleEndian.PutUint64(id[:], rand.Uint64())
		binary.LittleEndian.PutUint64(id[8:], rand.Uint64())
	}
	return id
}

func randomSpanID() trace.SpanID {
	var id trace.SpanID
	for !id.IsValid() {
		binary.LittleEndian.PutUint64(id[:], rand.Uint64())
	}
	return id
}
