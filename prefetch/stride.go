package prefetch

// strideState is the confidence of Baer and Chen's reference-prediction entry.
type strideState uint8

const (
	strideInitial   strideState = iota // new, or a steady stride just missed once
	strideTransient                    // a new stride seen once: not trusted yet
	strideSteady                       // the stride held at least twice: prefetch along it
	strideNoPred                       // strides keep changing: wait for one to repeat
)

// stride is a Baer-Chen stride prefetcher over one process's whole fault stream (a hardware
// table has one entry per load instruction; a page-fault stream has no instruction, so one
// entry serves the process). See the package doc.
type stride struct {
	degree  int         // pages fetched along the stride when steady (Max)
	last    uint64      // the previous fault's page
	started bool        // a fault was seen: last is valid
	stride  int64       // the stride being confirmed or followed
	state   strideState // the entry's confidence in stride
}

func (s *stride) Name() string { return NameStride }

func (s *stride) Access(page uint64, _ bool, out []uint64) []uint64 {
	if !s.started {
		s.last, s.started, s.state = page, true, strideInitial
		return out
	}
	delta := int64(page - s.last)
	s.last = page
	correct := delta == s.stride
	// Baer and Chen's transitions: a correct prediction raises confidence; a wrong one in
	// steady keeps the stride (one irregular fault is forgiven), elsewhere replaces it.
	switch s.state {
	case strideInitial:
		if correct {
			s.state = strideSteady
		} else {
			s.state, s.stride = strideTransient, delta
		}
	case strideTransient:
		if correct {
			s.state = strideSteady
		} else {
			s.state, s.stride = strideNoPred, delta
		}
	case strideSteady:
		if !correct {
			s.state = strideInitial
		}
	case strideNoPred:
		if correct {
			s.state = strideTransient
		} else {
			s.stride = delta
		}
	}
	if s.state != strideSteady || s.stride == 0 {
		return out
	}
	return appendStride(out, page, s.stride, s.degree)
}
