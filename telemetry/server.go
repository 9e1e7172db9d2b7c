package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/farmem/farmem/fabric"
)

// ServerTelemetry is a memory server's: a span for every traced request it serves ("memserver
// read", "memserver write", kind server), each a child of the client span the request carried,
// the backend fetch of a sampled page fault. Only spans: the server's figures are the ctrl's.
//
// The fabric server tells of each request (fabric.ServerConfig.Trace) on the connection's
// goroutine, between one answer and the next request; the spans are made on a goroutine of
// their own, as the client's are, so that the next request does not wait on the SDK.
type ServerTelemetry struct {
	once    sync.Once
	warn    func(string)
	tp      *sdktrace.TracerProvider
	tr      trace.Tracer
	ch      chan serverItem
	dropped atomic.Int64
}

type serverItem struct {
	req  fabric.TracedRequest
	done chan struct{} // a flush marker
}

// DefaultServerService is the memory server's service.name (OTEL_SERVICE_NAME overrides it).
const DefaultServerService = "farmem-memserver"

// StartServer starts a memory server's span exporter for cfg (resolved; see Config.Tracing:
// nothing to export is an error, the caller checks first). advertise is the server's address
// as clients dial it, a resource attribute. warn prints one line, once, for the first export
// error.
func StartServer(ctx context.Context, cfg Config, advertise string, warn func(string)) (*ServerTelemetry, error) {
	if !cfg.Tracing() {
		return nil, errors.New("telemetry: no OTLP endpoint to export a memory server's spans to")
	}
	t := &ServerTelemetry{warn: warn, ch: make(chan serverItem, 4096)}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(t.warnOnce))
	res, err := newResource(ctx, DefaultServerService, attribute.String("server.address", advertise))
	if err != nil {
		return nil, err
	}
	// The client sampled the fault already (its trace flags say so): unless OTEL_TRACES_SAMPLER
	// says otherwise, a context not sampled is not recorded here either, so a trace is whole or
	// absent on both sides.
	t.tp, err = newTracerProvider(ctx, &cfg, res, cfg.sampler.sdk())
	if err != nil {
		return nil, err
	}
	t.tr = t.tp.Tracer("github.com/farmem/farmem/telemetry")
	go t.loop()
	return t, nil
}

// Trace is the fabric.ServerConfig.Trace hook: it copies the record and never waits (a full
// queue drops it, counted).
func (t *ServerTelemetry) Trace(r *fabric.TracedRequest) {
	select {
	case t.ch <- serverItem{req: *r}:
	default:
		t.dropped.Add(1)
	}
}

// Dropped is how many traced requests got no span because the span goroutine was behind.
func (t *ServerTelemetry) Dropped() int64 { return t.dropped.Load() }

func (t *ServerTelemetry) loop() {
	for it := range t.ch {
		if it.done != nil {
			close(it.done)
			continue
		}
		t.span(&it.req)
	}
}

func (t *ServerTelemetry) span(r *fabric.TracedRequest) {
	parent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: r.Context.TraceID, SpanID: r.Context.SpanID,
		TraceFlags: trace.TraceFlags(r.Context.Flags), Remote: true})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), parent)
	name := "memserver read"
	if r.Op == fabric.OpWrite {
		name = "memserver write"
	}
	_, sp := t.tr.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(r.Start),
		trace.WithAttributes(
			attribute.Int("farmem.pages", r.Pages),
			attribute.Int("farmem.bytes", r.Pages*fabric.PageSize),
			attribute.String("farmem.slab", fmt.Sprint(r.Slab)), // a u64: an int attribute could not hold every id
			attribute.Int("farmem.slabs", r.Slabs),
			attribute.String("farmem.session", r.Session.String()),
			attribute.String("client.address", r.Peer),
			attribute.String("farmem.status", r.Status.String()),
		))
	switch {
	case r.Err != nil:
		sp.SetStatus(codes.Error, r.Err.Error())
	case r.Status != fabric.StatusOK:
		sp.SetStatus(codes.Error, r.Message)
	}
	sp.End(trace.WithTimestamp(r.End))
}

// flush waits until every record handed to Trace so far is a span.
func (t *ServerTelemetry) flush() {
	done := make(chan struct{})
	t.ch <- serverItem{done: done}
	<-done
}

// Shutdown makes the last spans and exports them, giving up at ctx's deadline. Trace may still
// be called after it (a connection finishing a request): those records are dropped.
func (t *ServerTelemetry) Shutdown(ctx context.Context) error {
	t.flush()
	err := t.tp.Shutdown(ctx)
	if err != nil {
		t.warnOnce(err)
	}
	return err
}

func (t *ServerTelemetry) warnOnce(err error) {
	t.once.Do(func() {
		t.warn(fmt.Sprintf("telemetry: %v (the memory server serves on; further telemetry errors are not shown)", err))
	})
}
