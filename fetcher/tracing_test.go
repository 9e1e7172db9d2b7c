package fetcher

import (
	"testing"
	"time"

	"github.com/farmem/farmem/backend"
)

type countTracer struct{ faults, prefetches int }

func (c *countTracer) Fault(*FaultRecord)       { c.faults++ }
func (c *countTracer) Prefetch(*PrefetchRecord) { c.prefetches++ }

// The fault path's tracing side: an unsampled fast fault allocates nothing and never reaches
// the tracer; a slow one always does; the head sampler keeps about the ratio asked for.
func TestTraceFaultSampling(t *testing.T) {
	tr := &countTracer{}
	p := &Fetcher{host: nopHost{}, tracing: &Tracing{Tracer: tr, Slow: time.Millisecond}}
	p.clock.on, p.clock.rng = true, 1
	since := time.Now()
	fault := func(d time.Duration) {
		p.clock.reset(p.tracing.Sample, 0x7f0000001000)
		p.clock.mark(&p.clock.lookup)
		p.clock.mark(&p.clock.install)
		p.traceFault(p.tracing, 0, 0x7f0000001000, FromBackend, since, d)
	}
	if a := testing.AllocsPerRun(1000, func() { fault(time.Microsecond) }); a != 0 {
		t.Fatalf("an unsampled fault allocates %.1f times", a)
	}
	if tr.faults != 0 {
		t.Fatalf("sampling off, no fault slow: %d faults traced", tr.faults)
	}
	for range 100 {
		fault(2 * time.Millisecond)
	}
	if tr.faults != 100 {
		t.Fatalf("%d of 100 faults over TraceSlow traced", tr.faults)
	}
	tr.faults = 0
	p.tracing.Sample = SampleThreshold(0.01)
	const n = 200000
	for range n {
		fault(time.Microsecond)
	}
	if tr.faults < n/100*8/10 || tr.faults > n/100*12/10 {
		t.Fatalf("ratio 0.01 traced %d of %d faults", tr.faults, n)
	}
	tr.faults = 0
	p.tracing.Sample = SampleThreshold(1)
	for range 1000 {
		fault(time.Microsecond)
	}
	if tr.faults != 1000 {
		t.Fatalf("ratio 1 traced %d of 1000 faults", tr.faults)
	}
}

// A record's stages are offsets from the read, in order, and stages not taken stay 0.
func TestTraceFaultRecord(t *testing.T) {
	var got FaultRecord
	tr := tracerFunc(func(r *FaultRecord) { got = *r })
	p := &Fetcher{host: nopHost{}, tracing: &Tracing{Tracer: tr, Sample: SampleThreshold(1)}}
	p.clock.on, p.clock.rng = true, 1
	since := time.Now()
	p.clock.reset(p.tracing.Sample, 0x7f0000001000)
	p.clock.mark(&p.clock.lookup)
	p.clock.mark(&p.clock.install)
	p.traceFault(p.tracing, 1 /* write */, 0x2000, FromZero, since, time.Since(since))
	if !got.Head || got.Addr != 0x2000 || got.Kind != KindWrite || got.Source != FromZero {
		t.Fatalf("record %+v", got)
	}
	if got.Begin <= 0 || got.Lookup < got.Begin || got.Install < got.Lookup || got.Fetch != 0 || got.Wake != 0 {
		t.Fatalf("stages begin %v lookup %v fetch %v install %v wake %v", got.Begin, got.Lookup, got.Fetch, got.Install, got.Wake)
	}
}

type tracerFunc func(*FaultRecord)

func (f tracerFunc) Fault(r *FaultRecord)   { f(r) }
func (tracerFunc) Prefetch(*PrefetchRecord) {}

// The tracing work a fault does besides being served, with tracing off (a flag test per stage)
// and on at the default sampling for a fast unsampled fault (clock reads, the draw, the slow
// test): results/telemetry.md.
func BenchmarkFaultTracingOverhead(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on-unsampled"
		}
		b.Run(name, func(b *testing.B) {
			tr := &countTracer{}
			p := &Fetcher{host: nopHost{}}
			if on {
				p.tracing = &Tracing{Tracer: tr, Sample: SampleThreshold(0.01), Slow: 100 * time.Microsecond}
			}
			p.clock.on, p.clock.rng = on, 1
			since := time.Now()
			for b.Loop() {
				if p.clock.on {
					p.clock.reset(p.tracing.Sample, 0x7f0000001000)
				}
				p.clock.mark(&p.clock.lookup)
				p.clock.mark(&p.clock.fetch)
				p.clock.mark(&p.clock.install)
				if p.tracing != nil {
					p.traceFault(p.tracing, 0, 0x1000, FromBackend, since, time.Microsecond)
				}
			}
		})
	}
}

// The slow budget keeps PerSecond records a second and counts the rest; zero keeps every one.
func TestSlowBudget(t *testing.T) {
	b := SlowBudget{PerSecond: 3}
	kept := 0
	for range 20 {
		if b.take() {
			kept++
		}
	}
	// 20 takes fit in one second, or straddle two: 3 kept, or at most 6.
	if kept < 3 || kept > 6 || b.Skipped() != int64(20-kept) {
		t.Errorf("budget of 3 a second: %d of 20 kept, %d skipped", kept, b.Skipped())
	}
	var none SlowBudget
	for range 1000 {
		if !none.take() {
			t.Fatal("a zero budget refused a record")
		}
	}
}

// tracedStore is a backend that records the trace contexts its loads carry.
type tracedStore struct {
	backend.Backend
	loads  int
	traced []backend.TraceContext
}

func (s *tracedStore) Load(backend.Slot, []byte) error { s.loads++; return nil }

func (s *tracedStore) LoadTraced(_ backend.Slot, _ []byte, tc backend.TraceContext) (backend.LoadedFrom, error) {
	s.traced = append(s.traced, tc)
	return backend.LoadedFrom{Server: "10.0.0.7:7070", Transport: "tcp", Replica: 1}, nil
}

// A head-sampled fault has its ids before its fetch: the read carries them, and the record the
// tracer gets names the same ones (the spans are made with them) and the copy that answered.
// Faults not head-sampled read untraced and carry no ids, even when traced for being slow; and
// drawing and making ids allocates nothing.
func TestHeadSampledFaultCarriesIDs(t *testing.T) {
	var got []FaultRecord
	tr := tracerFunc(func(r *FaultRecord) { got = append(got, *r) })
	store := &tracedStore{}
	p := &Fetcher{host: nopHost{}, store: store, tracing: &Tracing{Tracer: tr, Sample: SampleThreshold(1), Slow: time.Millisecond}}
	p.clock.on, p.clock.rng = true, 1
	buf := make([]byte, PageSize)
	fault := func(d time.Duration) {
		p.clock.reset(p.tracing.Sample, 0x7f0000001000)
		p.clock.mark(&p.clock.lookup)
		p.clock.slot = 5
		if err := p.fetchPage(5, buf); err != nil {
			t.Fatal(err)
		}
		p.clock.mark(&p.clock.fetch)
		p.clock.mark(&p.clock.install)
		p.traceFault(p.tracing, 0, 0x7f0000001000, FromBackend, time.Now(), d)
	}
	fault(time.Microsecond)
	fault(time.Microsecond)
	if len(store.traced) != 2 || store.loads != 0 || len(got) != 2 {
		t.Fatalf("two head-sampled faults: %d traced loads, %d plain, %d records", len(store.traced), store.loads, len(got))
	}
	for i, r := range got {
		tc := store.traced[i]
		if !r.Head || r.TraceID != tc.TraceID || r.FetchSpan != tc.SpanID || tc.Flags != 1 {
			t.Fatalf("fault %d: record ids %x/%x, its read carried %x/%x flags %d", i, r.TraceID, r.FetchSpan, tc.TraceID, tc.SpanID, tc.Flags)
		}
		if r.TraceID == [16]byte{} || r.FetchSpan == [8]byte{} {
			t.Fatalf("fault %d: zero ids %x/%x", i, r.TraceID, r.FetchSpan)
		}
		if r.From.Server != "10.0.0.7:7070" || r.From.Transport != "tcp" || r.From.Replica != 1 {
			t.Fatalf("fault %d: answered by %+v, the store said 10.0.0.7:7070 tcp replica 1", i, r.From)
		}
	}
	if got[0].TraceID == got[1].TraceID || got[0].FetchSpan == got[1].FetchSpan {
		t.Fatalf("two faults got the same ids: %x/%x", got[0].TraceID, got[0].FetchSpan)
	}

	// Not head-sampled: a plain Load, and a slow one is traced with no ids (a fresh trace).
	p.tracing.Sample = 0
	got, store.traced = nil, nil
	fault(2 * time.Millisecond)
	if store.loads != 1 || len(store.traced) != 0 || len(got) != 1 {
		t.Fatalf("a slow fault: %d plain loads, %d traced, %d records", store.loads, len(store.traced), len(got))
	}
	if r := got[0]; r.Head || r.TraceID != [16]byte{} || r.FetchSpan != [8]byte{} || r.From != (backend.LoadedFrom{}) {
		t.Fatalf("a fault kept for being slow carries ids %x/%x from %+v", r.TraceID, r.FetchSpan, r.From)
	}

	p.tracing.Sample = SampleThreshold(1)
	store.traced = make([]backend.TraceContext, 0, 2000)
	if a := testing.AllocsPerRun(1000, func() {
		p.clock.reset(p.tracing.Sample, 0x7f0000001000)
		p.fetchPage(5, buf)
	}); a != 0 {
		t.Fatalf("a head-sampled fault's draw, ids and traced fetch allocate %.1f times", a)
	}
}

// A fault whose attempt fetched its page and was then retried keeps that attempt's draw and
// ids, however many attempts it takes (its first read named the fetch span its last one makes),
// and draws no second chance; once served, its page's next fault draws afresh.
func TestRetriedFaultKeepsItsDraw(t *testing.T) {
	var got []FaultRecord
	tr := tracerFunc(func(r *FaultRecord) { got = append(got, *r) })
	store := &tracedStore{}
	p := &Fetcher{host: nopHost{}, store: store, tracing: &Tracing{Tracer: tr, Sample: SampleThreshold(1)}}
	p.clock.on, p.clock.rng = true, 1
	buf := make([]byte, PageSize)
	const pg, other = 0x7f0000001000, 0x7f0000009000
	attempt := func(page uint64, retried, fetch bool) {
		p.clock.retried = retried
		p.clock.reset(p.tracing.Sample, page)
		if fetch {
			p.fetchPage(5, buf)
			p.clock.mark(&p.clock.fetch)
		}
	}
	attempt(pg, false, true) // fetched, then EAGAIN: retried
	p.tracing.Sample = 0     // a fresh draw would now say no
	attempt(other, false, true)
	attempt(pg, true, false) // retried again before fetching (at the cap)
	attempt(pg, true, true)
	p.traceFault(p.tracing, 0, pg, FromBackend, time.Now(), time.Microsecond)
	if len(store.traced) != 2 || store.loads != 1 || len(got) != 1 {
		t.Fatalf("%d traced reads, %d untraced, %d records; want the sampled fault's two reads traced, the other's not, one record",
			len(store.traced), store.loads, len(got))
	}
	first, last := store.traced[0], store.traced[1]
	if !got[0].Head || first != last || got[0].TraceID != first.TraceID || got[0].FetchSpan != first.SpanID {
		t.Fatalf("the retried fault read with %x/%x then %x/%x, its record says %x/%x (head %v)",
			first.TraceID, first.SpanID, last.TraceID, last.SpanID, got[0].TraceID, got[0].FetchSpan, got[0].Head)
	}
	// Served: the page's next fault, even one that is retried, draws again (and is not picked).
	attempt(pg, true, true)
	p.traceFault(p.tracing, 0, pg, FromBackend, time.Now(), time.Microsecond)
	if len(got) != 1 || store.loads != 2 {
		t.Fatalf("a served fault's draw outlived it: %d records, %d untraced loads", len(got), store.loads)
	}
	// An attempt not picked keeps that too: its retry gets no second chance.
	attempt(pg, false, true)
	p.tracing.Sample = SampleThreshold(1)
	attempt(pg, true, true)
	p.traceFault(p.tracing, 0, pg, FromBackend, time.Now(), time.Microsecond)
	if len(got) != 1 || store.loads != 4 {
		t.Fatalf("a retried fault not picked was drawn again: %d records, %d untraced loads", len(got), store.loads)
	}
}
