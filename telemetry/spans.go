package telemetry

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/fetcher"
)

// sourceName is how spans and metrics name a fault's source.
var sourceName = [fetcher.NumSources]string{fetcher.FromZero: "zero", fetcher.FromBackend: "backend", fetcher.FromWP: "wp", fetcher.FromCache: "prefetch_cache"}

var kindName = [...]string{fetcher.KindRead: "read", fetcher.KindWrite: "write", fetcher.KindWP: "wp"}

// item is one record on its way to becoming spans. The records are copied by value: the
// channel's buffer is the only memory they take, allocated once.
type item struct {
	what  uint8 // itemFault, itemPrefetch, itemEvict, itemFlush
	fault fetcher.FaultRecord
	pf    fetcher.PrefetchRecord
	ev    evictor.BatchRecord
	done  chan struct{}
}

const (
	itemFault = iota
	itemPrefetch
	itemEvict
	itemFlush
)

// spanWorker makes spans from records, on its own goroutine. It implements fetcher.Tracer.
type spanWorker struct {
	tr       trace.Tracer
	ch       chan item
	dropped  atomic.Int64
	describe fetcher.LoadDescriber // nil: the embedded store
	sample   uint64
	evRng    uint64      // the evictor goroutine's sampler state (only it draws)
	waited   atomic.Bool // a traced fault waited (for room or an event) since the last traced batch

	// Owned by the goroutine: recent fault spans by (pid, page), for prefetch batches' links,
	// and the last traced fault that waited, for eviction batches' links.
	recent     [256]recentFault
	next       int
	lastWaited trace.SpanContext
}

type recentFault struct {
	pid  int
	addr uint64
	sc   trace.SpanContext
}

func newSpanWorker(tr trace.Tracer, cfg Config) *spanWorker {
	w := &spanWorker{tr: tr, ch: make(chan item, 1024), sample: fetcher.SampleThreshold(cfg.Sample), evRng: uint64(time.Now().UnixNano()) | 1}
	go w.loop()
	return w
}

func (w *spanWorker) send(it *item) {
	select {
	case w.ch <- *it:
	default:
		w.dropped.Add(1)
	}
}

// Fault implements fetcher.Tracer (on the fault thread, after the wake).
func (w *spanWorker) Fault(r *fetcher.FaultRecord) {
	if r.Waited {
		w.waited.Store(true)
	}
	w.send(&item{what: itemFault, fault: *r})
}

// Prefetch implements fetcher.Tracer (on a prefetch worker).
func (w *spanWorker) Prefetch(r *fetcher.PrefetchRecord) { w.send(&item{what: itemPrefetch, pf: *r}) }

// evicted is evictor.Evictor.Trace: a batch is traced if the head sampler picks it, or if a
// traced fault waited since the last traced batch (the batch is then what it waited for).
func (w *spanWorker) evicted(r *evictor.BatchRecord) {
	x := w.evRng
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	w.evRng = x
	if (w.sample != 0 && x <= w.sample) || w.waited.Swap(false) {
		w.send(&item{what: itemEvict, ev: *r})
	}
}

// flush waits until every record sent so far is a span (ended, so in the batch processor).
func (w *spanWorker) flush() {
	done := make(chan struct{})
	w.ch <- item{what: itemFlush, done: done}
	<-done
}

func (w *spanWorker) loop() {
	for it := range w.ch {
		switch it.what {
		case itemFault:
			w.fault(&it.fault)
		case itemPrefetch:
			w.prefetch(&it.pf)
		case itemEvict:
			w.evict(&it.ev)
		case itemFlush:
			close(it.done)
		}
	}
}

// stage ends a child span of ctx over [from, to] after at.
func (w *spanWorker) stage(ctx context.Context, name string, at time.Time, from, to time.Duration, attrs ...attribute.KeyValue) {
	if to <= 0 || to < from {
		return
	}
	_, s := w.tr.Start(ctx, name, trace.WithTimestamp(at.Add(from)), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(at.Add(to)))
}

func (w *spanWorker) fault(f *fetcher.FaultRecord) {
	sampled := "slow"
	if f.Head {
		sampled = "head"
	}
	// The fault ends at its wake; an inline prefetch that follows is a child of its own.
	end := f.End
	if f.PrefetchStart > 0 && f.PrefetchStart < end {
		end = f.PrefetchStart
	}
	// A head-sampled fault's ids were given before its fetch (the memory server's span of the
	// read names FetchSpan as its parent): the spans take them (presetIDGenerator).
	root := context.Background()
	if f.TraceID != ([16]byte{}) {
		root = withPresetIDs(root, presetIDs{traceID: f.TraceID})
	}
	ctx, sp := w.tr.Start(root, "page fault", trace.WithTimestamp(f.Read), trace.WithNewRoot(),
		trace.WithAttributes(
			attribute.Int(attrProcessPID, f.Pid),
			attribute.String("farmem.page.address", fmt.Sprintf("%#x", f.Addr)),
			attribute.String(attrFaultKind, kindName[f.Kind]),
			attribute.String(attrFaultSource, sourceName[f.Source]),
			attribute.Int("farmem.fault.pages", f.Pages),
			attribute.Bool("farmem.fault.waited", f.Waited),
			attribute.String("farmem.fault.sampled", sampled),
		))
	at := f.Read
	prev := time.Duration(0)
	if f.Begin > 0 {
		w.stage(ctx, "queue wait", at, 0, f.Begin)
		prev = f.Begin
	}
	if f.Lookup > 0 {
		w.stage(ctx, "lookup", at, prev, f.Lookup)
		prev = f.Lookup
	}
	if f.Fetch > 0 {
		attrs := []attribute.KeyValue{attribute.Int("farmem.bytes", fetcher.PageSize)}
		switch {
		case f.From.Server != "": // the copy that answered (a head-sampled fault's traced load)
			attrs = append(attrs, attribute.String("server.address", f.From.Server), attribute.String("farmem.transport", f.From.Transport),
				attribute.Int("farmem.replica", f.From.Replica))
		case w.describe != nil: // the copy a read prefers now (a fault kept for being slow)
			if srv, tr, rep, ok := w.describe.DescribeLoad(f.Slot); ok {
				attrs = append(attrs, attribute.String("server.address", srv), attribute.String("farmem.transport", tr),
					attribute.Int("farmem.replica", rep))
			}
		default:
			attrs = append(attrs, attribute.String("farmem.transport", "embedded"))
		}
		fetchCtx := ctx
		if f.FetchSpan != ([8]byte{}) {
			fetchCtx = withPresetIDs(ctx, presetIDs{spanID: f.FetchSpan})
		}
		w.stage(fetchCtx, "backend fetch", at, prev, f.Fetch, attrs...)
		prev = f.Fetch
	}
	if f.Install > 0 {
		w.stage(ctx, "install", at, prev, f.Install, attribute.String("farmem.ioctl", f.Ioctl.String()), attribute.Int("farmem.pages", f.Pages))
		prev = f.Install
	}
	if f.Wake > 0 {
		w.stage(ctx, "wake", at, prev, f.Wake)
	}
	sp.End(trace.WithTimestamp(at.Add(end)))
	if f.PrefetchPages > 0 {
		w.stage(ctx, "prefetch batch", at, f.PrefetchStart, f.PrefetchEnd,
			attribute.Int("farmem.prefetch.pages", f.PrefetchPages), attribute.Int("farmem.prefetch.placed", f.PrefetchPlaced))
	}
	sc := sp.SpanContext()
	w.recent[w.next] = recentFault{pid: f.Pid, addr: f.Addr, sc: sc}
	w.next = (w.next + 1) % len(w.recent)
	if f.Waited {
		w.lastWaited = sc
	}
}

func (w *spanWorker) prefetch(r *fetcher.PrefetchRecord) {
	opts := []trace.SpanStartOption{trace.WithTimestamp(r.Start), trace.WithNewRoot(), trace.WithAttributes(
		attribute.Int(attrProcessPID, r.Pid),
		attribute.String("farmem.prefetch.trigger", fmt.Sprintf("%#x", r.Trigger)),
		attribute.Int("farmem.prefetch.pages", r.Pages),
		attribute.Int("farmem.prefetch.placed", r.Delivered),
	)}
	for _, rf := range w.recent {
		if rf.pid == r.Pid && rf.addr == r.Trigger && rf.sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: rf.sc}))
			break
		}
	}
	ctx, sp := w.tr.Start(context.Background(), "prefetch batch", opts...)
	w.stage(ctx, "backend fetch", r.Start, 0, r.Load, attribute.Int("farmem.bytes", r.Pages*fetcher.PageSize))
	w.stage(ctx, "install", r.Start, r.Load, r.End)
	sp.End(trace.WithTimestamp(r.Start.Add(r.End)))
}

func (w *spanWorker) evict(r *evictor.BatchRecord) {
	opts := []trace.SpanStartOption{trace.WithTimestamp(r.Start), trace.WithNewRoot(), trace.WithAttributes(
		attribute.Int(attrProcessPID, r.Pid),
		attribute.Int("farmem.eviction.victims", r.Victims),
		attribute.Int("farmem.eviction.written", r.Written),
		attribute.Int("farmem.eviction.clean_dropped", r.Dropped),
		attribute.Int("farmem.eviction.zero", r.Zero),
		attribute.Int("farmem.eviction.runs", r.Runs),
		attribute.Int("farmem.eviction.moved", r.Staged),
	)}
	if w.lastWaited.IsValid() {
		// The last traced fault that had to wait: this batch is what made room for it.
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: w.lastWaited}))
		w.lastWaited = trace.SpanContext{}
	}
	ctx, sp := w.tr.Start(context.Background(), "eviction batch", opts...)
	prev := time.Duration(0)
	for _, s := range []struct {
		name string
		end  time.Duration
	}{{"agent move", r.Move}, {"write-protect", r.Protect}, {"copy out", r.Copy}, {"backend store", r.Store}, {"agent drop", r.Drop}, {"wake", r.End}} {
		if s.end > 0 {
			w.stage(ctx, s.name, r.Start, prev, s.end)
			prev = s.end
		}
	}
	sp.End(trace.WithTimestamp(r.Start.Add(r.End)))
}
