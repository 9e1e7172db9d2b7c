package fetcher

// zeroStreams predicts first touches: a program filling memory touches a few regions in turn
// (jemalloc fills an extent per size class, a loader fills several arrays), so one "next page"
// for the whole process keeps losing its stream. Like Linux read-ahead keeps a window per
// open file, each of a few streams remembers the page after its last fill and a window that
// doubles while faults keep landing there. Pure state: tested without a kernel.
type zeroStreams struct {
	s    [zeroStreamCount]zeroStream
	tick uint64
}

type zeroStream struct {
	next uint64 // the page right after the stream's last fill
	win  int    // pages the stream's last fill asked for
	used uint64 // tick of the last fault that hit the stream (0 = free slot)
}

const zeroStreamCount = 8

// window returns the stream a first-touch fault at pg belongs to and how many pages (at most
// maxWin) to fill from pg: double the stream's last window if pg continues it, else 1 in a new
// stream that replaces the least recently used one.
func (z *zeroStreams) window(pg uint64, maxWin int) (stream, pages int) {
	z.tick++
	lru := 0
	for i := range z.s {
		if z.s[i].used != 0 && z.s[i].next == pg {
			z.s[i].used = z.tick
			z.s[i].win = min(z.s[i].win*2, maxWin)
			return i, z.s[i].win
		}
		if z.s[i].used < z.s[lru].used {
			lru = i
		}
	}
	z.s[lru] = zeroStream{next: pg, win: 1, used: z.tick}
	return lru, 1
}

// filled records that stream's fill ended right before next.
func (z *zeroStreams) filled(stream int, next uint64) { z.s[stream].next = next }
