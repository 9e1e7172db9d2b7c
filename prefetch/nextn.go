package prefetch

// nextN is next-N-line prefetching: after every fault, hit or miss, the N pages that follow.
// Issued on hits too, a sequential scan stays N pages ahead; it never looks backwards or
// along a stride, which is what the other prefetchers are measured against.
type nextN struct {
	n int // pages fetched after each fault (Max)
}

func (p *nextN) Name() string { return NameNextN }

func (p *nextN) Access(page uint64, _ bool, out []uint64) []uint64 {
	return appendStride(out, page, 1, p.n)
}
