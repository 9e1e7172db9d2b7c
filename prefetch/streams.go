package prefetch

// streams is Leap with a table of the process's sequential streams beside it.
//
// Leap votes over one history of deltas between consecutive faults. A process that walks
// memory in order while it also touches pages at random (a garbage collector's allocation
// and copying beside a program's random reads of its heap, both in the one stream of faults)
// interleaves its deltas: the sequential walk's +1s never hold a majority, and Leap finds no
// trend. In map mode it is worse, as the pages it installed are never seen, so a stream that
// Leap did follow shows as one miss a window apart, among the random ones.
//
// So each miss is also matched against the last few streams, each a page where it last
// faulted (last) and how many pages were installed after it (window): a miss at most
// streamSlack pages past last+window continues the stream. A continued stream doubles its
// window (from streamStart up to Max) and installs that many pages after the miss; a
// stream with nothing installed yet needs two misses in order before it installs anything,
// so a process that faults at random installs nothing. A miss that continues no stream starts
// one (see victim for whose slot it takes). Leap's own prediction, when it has one, goes
// first, and the stream's follows it, up to Max pages in all.
type streamTable struct {
	leap *leap
	tab  [streamSlots]stream
	tick uint64 // misses seen: the clock of stream.used
	max  int
}

// stream is one sequential walk the process seems to make.
type stream struct {
	last   uint64 // the page of the miss that last continued it
	window int    // pages installed after last (0: none yet)
	used   uint64 // tick of its last miss, for replacement
	valid  bool
}

const (
	streamSlots = 16 // streams followed at once: a collector's few regions, the program's own
	streamSlack = 4  // pages a walk may skip and still continue its stream
	streamStart = 2  // the first window of a stream found by two misses in order
)

// NameStreams is Leap with a table of sequential streams beside its history.
const NameStreams = "streams"

func newStreams(history, split, max int) *streamTable {
	return &streamTable{leap: newLeap(history, split, max), max: max}
}

func (s *streamTable) Name() string { return NameStreams }

func (s *streamTable) Access(page uint64, hit bool, out []uint64) []uint64 {
	base := len(out)
	out = s.leap.Access(page, hit, out)
	if hit {
		return out
	}
	s.tick++
	st := s.match(page)
	if st == nil {
		st = s.victim()
		*st = stream{last: page, used: s.tick, valid: true}
		return out
	}
	w := streamStart
	if st.window > 0 {
		w = min(2*st.window, s.max)
	}
	fresh := st.window == 0
	st.last, st.window, st.used = page, w, s.tick
	if fresh {
		s.confirmed(st)
	}
	// Up to Max in all, Leap's pages first; a page Leap named already is not named twice.
	room := s.max - (len(out) - base)
	for d := uint64(1); d <= uint64(w) && room > 0 && page+d > page; d++ {
		if !contains(out[base:], page+d) {
			out = append(out, page+d)
			room--
		}
	}
	return out
}

// match returns the stream that a miss on page continues, nil if none.
func (s *streamTable) match(page uint64) *stream {
	for i := range s.tab {
		st := &s.tab[i]
		if !st.valid || page <= st.last {
			continue
		}
		if page-st.last <= uint64(st.window)+streamSlack {
			return st
		}
	}
	return nil
}

// victim returns a slot for a new stream: a free one, else the least recently seen of those
// not confirmed (a single miss so far), else the least recently continued. Random misses, which
// start a stream each, so churn among themselves and never push out a confirmed walk.
func (s *streamTable) victim() *stream {
	var v, vc *stream
	for i := range s.tab {
		st := &s.tab[i]
		switch {
		case !st.valid:
			return st
		case st.window == 0 && (v == nil || st.used < v.used):
			v = st
		case st.window > 0 && (vc == nil || st.used < vc.used):
			vc = st
		}
	}
	if v != nil {
		return v
	}
	return vc
}

// confirmed notes that st has just been confirmed (its second miss in order): past
// streamSlots/2 confirmed streams the least recently continued other one is forgotten, so
// that a walk that ended does not hold its slot from new candidates for ever.
func (s *streamTable) confirmed(st *stream) {
	var n int
	var old *stream
	for i := range s.tab {
		o := &s.tab[i]
		if !o.valid || o.window == 0 {
			continue
		}
		n++
		if o != st && (old == nil || o.used < old.used) {
			old = o
		}
	}
	if n > streamSlots/2 && old != nil {
		*old = stream{}
	}
}

func contains(pages []uint64, p uint64) bool {
	for _, q := range pages {
		if q == p {
			return true
		}
	}
	return false
}
