package main

import (
	"math"
	"slices"
	"time"
)

// The copy model. A replacement replica is filled by its client: it reads the slab from a
// ready copy's server and writes it to the new one (remote/maintain.go), every slab's copy at
// once. So each copy crosses three NICs: the source server's sending side, the client host's
// (receiving, then sending: one host, counted once at ClientBW), and the target server's
// receiving side. Every NIC shares its bandwidth equally among the copies crossing it, and a
// copy moves at the smallest of its three shares, recomputed whenever a copy starts or ends.
// A copy moves the whole slab (an upper bound: a client copies only the pages it has handed
// out). Copies are what restore replicas, so the restore times are this model's; the ctrl's
// own part is deciding where they go.
type copyModel struct {
	serverBW, clientBW float64
	jobs               []*copyJob // in flight, in start order
	last               time.Duration
	gen                uint64 // moves when the next completion changes: older completion events are void
	pending            bool   // a reschedule is queued at the current instant
	done               uint64 // bytes of copies finished since takeDone
}

type copyJob struct {
	sess     *simSession
	slab     uint64
	src, dst *simServer
	bytes    float64
	left     float64
	rate     float64 // bytes/s
}

func (m *copyModel) init(serverBW, clientBW float64) {
	m.serverBW, m.clientBW = serverBW, clientBW
}

func (m *copyModel) active() int { return len(m.jobs) }

func (m *copyModel) takeDone() uint64 {
	d := m.done
	m.done = 0
	return d
}

// advance moves every copy on to now at its rate.
func (m *copyModel) advance(now time.Duration) {
	dt := (now - m.last).Seconds()
	if dt > 0 {
		for _, j := range m.jobs {
			j.left -= j.rate * dt
		}
	}
	m.last = now
}

func (m *copyModel) start(s *Sim, j *copyJob) {
	m.advance(s.now)
	j.left = j.bytes
	m.jobs = append(m.jobs, j)
	m.changed(s)
}

// changed queues one reschedule at the current instant, after whatever else happens then (a
// rack loss starts thousands of copies at one instant).
func (m *copyModel) changed(s *Sim) {
	m.gen++
	if m.pending {
		return
	}
	m.pending = true
	s.at(s.now, func() {
		m.pending = false
		m.reschedule(s)
	})
}

// reschedule recomputes the rates and queues the next completion.
func (m *copyModel) reschedule(s *Sim) {
	m.advance(s.now)
	tx, rx := map[*simServer]int{}, map[*simServer]int{}
	cl := map[*simSession]int{}
	for _, j := range m.jobs {
		tx[j.src]++
		rx[j.dst]++
		cl[j.sess]++
	}
	next := math.Inf(1)
	for _, j := range m.jobs {
		j.rate = min(m.serverBW/float64(tx[j.src]), m.serverBW/float64(rx[j.dst]), m.clientBW/float64(cl[j.sess]))
		next = min(next, max(j.left, 0)/j.rate)
	}
	m.gen++
	if len(m.jobs) == 0 {
		return
	}
	g := m.gen
	s.at(s.now+time.Duration(math.Ceil(next*1e9)), func() {
		if g == m.gen {
			m.complete(s)
		}
	})
}

// complete ends the copies that are through, then tells their clients.
func (m *copyModel) complete(s *Sim) {
	m.advance(s.now)
	var finished []*copyJob
	m.jobs = slices.DeleteFunc(m.jobs, func(j *copyJob) bool {
		if j.left < 1 {
			finished = append(finished, j)
			return true
		}
		return false
	})
	m.changed(s)
	for _, j := range finished {
		m.done += uint64(j.bytes)
		s.copied(j)
	}
}

// abortServer drops the copies from or to a server that stopped.
func (m *copyModel) abortServer(s *Sim, srv *simServer) {
	m.abort(s, func(j *copyJob) bool { return j.src == srv || j.dst == srv })
}

// abortSession drops the copies of a session that ended.
func (m *copyModel) abortSession(s *Sim, ss *simSession) {
	m.abort(s, func(j *copyJob) bool { return j.sess == ss })
}

func (m *copyModel) abort(s *Sim, match func(*copyJob) bool) {
	m.advance(s.now)
	n := len(m.jobs)
	m.jobs = slices.DeleteFunc(m.jobs, func(j *copyJob) bool {
		if match(j) {
			delete(j.sess.copying, copyKey{j.slab, j.dst.id})
			return true
		}
		return false
	})
	if len(m.jobs) != n {
		m.changed(s)
	}
}
