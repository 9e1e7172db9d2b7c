/* floorcore.h: the pager of the floor, which floorpager.c runs in its own process and
 * floorshim.c, with --inproc, in the program's: the registered ranges, the FIFO, the store, the
 * fault thread's loop, the eviction batch and the summary line. Included by exactly one file of
 * each binary, so that everything stays static (the shim is loaded into programs whose symbols
 * must not meet ours).
 *
 * What differs between the two is in hooks the includer defines before including this file:
 *   die(fmt, ...)             stop everything, saying why
 *   fl_move(runs, n, first, &moved, &agent_ns)
 *                             move the pages of runs into the staging area, from staging page
 *                             first on, in order; pages moved, the ioctls' time, 0 or an errno
 *   fl_staged(nv)             the first nv staging pages' contents, readable here
 *   fl_drop(nv, &agent_ns)    madvise(DONTNEED) the first nv staging pages; 0 or an errno
 *   fl_store(len)             len bytes for a range's slots, filled in; NULL if none
 *   fl_zalloc(len)            len bytes of zeros for a range's state; NULL if none (the shim
 *                             must not call the program's malloc from its mmap)
 *   fl_status_path()          the program's /proc status file
 *   fl_gone(), fl_busy(b)     the program has exited; the fault thread is handling a read */
#ifndef FLOORCORE_H
#define FLOORCORE_H
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static int fl_move(const struct fl_run *runs, int n, uint64_t first, uint64_t *moved, uint64_t *agent_ns);
static const char *fl_staged(int nv);
static int fl_drop(int nv, uint64_t *agent_ns);
static char *fl_store(uint64_t len);
static void *fl_zalloc(uint64_t len);
static const char *fl_status_path(void);
static int fl_gone(void);
static void fl_busy(int b);

#define PG FL_PAGE
enum { ST_NONE, ST_RES, ST_EVICTED };

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* A registered mapping: each page's state, whether it is queued in the FIFO, and its slot in
 * the store. The control thread appends ranges; the fault thread reads them once published
 * (nranges), and alone changes state and the FIFO. */
struct range {
	uint64_t start, npages;
	uint8_t *state, *queued;
	char *store;
};
#define MAX_RANGES 256
static struct range ranges[MAX_RANGES];
static atomic_int nranges;

static int uffd = -1;
/* split_wake: install with DONTWAKE, then UFFDIO_WAKE. On one CPU the thread an install wakes
 * preempts the pager inside the ioctl and runs until it blocks again, so an install that wakes
 * returns only after the program's next stretch of work; split, the install is timed alone and
 * the wake holds the rest (the paging rate measured the same either way). --combined-wake
 * installs and wakes in one ioctl, as farmem does, whose fault service time includes it. */
static int split_wake = 1;
static uint64_t staging, cap_pages, resident;

/* The FIFO of resident pages: ids (range << 40 | page) in the order they were installed. A page
 * is in it at most once (queued), so it never holds more than the registered pages. */
#define FIFO_CAP (1ULL << 26)
static uint64_t *fifo, fifo_head, fifo_tail;

static struct range *find(uint64_t addr, uint64_t *idx)
{
	/* Newest first: a range unmapped and mapped again is registered anew. */
	for (int i = atomic_load(&nranges) - 1; i >= 0; i--) {
		struct range *r = &ranges[i];
		if (addr >= r->start && addr < r->start + r->npages * PG) {
			*idx = (addr - r->start) / PG;
			return r;
		}
	}
	return NULL;
}

/* ---- counters: sums in ns, for the means at exit */
static struct {
	uint64_t first, refault, wake, evicted, batches, runs, discarded, paging, wake_ns;
	uint64_t first_ns, first_install_ns, refault_ns, refault_install_ns;
	uint64_t move_ns, move_agent_ns, readv_ns, store_ns, drop_ns, drop_agent_ns, evict_ns;
	uint64_t peak_anon_kib;
	uint64_t t_first_evict;
} st;
#define NSAMPLES (1 << 20)
static uint32_t *samples; /* the refaults' handler times, for their median */

/* ---- events */

/* discard marks the pages of [s, e) gone from the program (madvise, munmap): the next fault on
 * one gets zeros, and an old slot is never served again. */
static void discard(uint64_t s, uint64_t e)
{
	for (int i = 0; i < atomic_load(&nranges); i++) {
		struct range *r = &ranges[i];
		uint64_t rs = r->start, re = r->start + r->npages * PG;
		uint64_t a = s > rs ? s : rs, b = e < re ? e : re;
		for (uint64_t p = a; p < b; p += PG) {
			uint64_t k = (p - rs) / PG;
			if (r->state[k] == ST_RES) resident--;
			if (r->state[k] != ST_NONE) st.discarded++;
			r->state[k] = ST_NONE;
		}
	}
}

struct pending { uint64_t addr, flags, t; };
static struct pending pend[64];
static int npend;

/* event handles a message that is not a fault; a fault is queued for serve. */
static void event(const struct uffd_msg *m, uint64_t t)
{
	switch (m->event) {
	case UFFD_EVENT_PAGEFAULT:
		if (npend == (int)(sizeof pend / sizeof pend[0])) die("too many faults pending");
		pend[npend++] = (struct pending){ m->arg.pagefault.address & ~(PG - 1), m->arg.pagefault.flags, t };
		return;
	case UFFD_EVENT_REMOVE:
	case UFFD_EVENT_UNMAP:
		discard(m->arg.remove.start, m->arg.remove.end);
		return;
	case UFFD_EVENT_FORK:
		die("the program forked: not supported (its child's evicted pages could not be served)");
	case UFFD_EVENT_REMAP:
		die("the program mremapped a registered mapping: not supported");
	}
	die("unexpected uffd event %#x", m->event);
}

/* drain reads what is queued on the uffd without waiting: events are handled, faults queued. */
static void drain(void)
{
	struct pollfd p = { uffd, POLLIN, 0 };
	struct uffd_msg m;
	while (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
		if (read(uffd, &m, sizeof m) != sizeof m) break;
		event(&m, now_ns());
	}
}

/* ---- eviction */
static uint64_t victims[FL_BATCH];

static uint64_t id_addr(uint64_t id) { return ranges[id >> 40].start + (id & ((1ULL << 40) - 1)) * PG; }
static uint8_t *id_state(uint64_t id) { return &ranges[id >> 40].state[id & ((1ULL << 40) - 1)]; }

/* sample_anon keeps the program's peak anonymous resident memory (RssAnon), read after each
 * batch, outside its timing: what the pager does not register (glibc's brk heap, thread stacks)
 * is neither paged nor capped here, so the program may hold more than the cap, and the harness
 * reports by how much. */
static void sample_anon(void)
{
	char buf[4096];
	int fd = open(fl_status_path(), O_RDONLY | O_CLOEXEC);
	if (fd < 0) return;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0) return;
	buf[n] = 0;
	char *p = strstr(buf, "RssAnon:");
	if (!p) return;
	uint64_t kib = strtoull(p + strlen("RssAnon:"), NULL, 10);
	if (kib > st.peak_anon_kib) st.peak_anon_kib = kib;
}

/* evict takes up to FL_BATCH of the oldest resident pages out of the program into the store. */
static void evict(void)
{
	uint64_t t0 = now_ns();
	int nv = 0;
	while (nv < FL_BATCH && fifo_head != fifo_tail) {
		uint64_t id = fifo[fifo_head++ % FIFO_CAP];
		ranges[id >> 40].queued[id & ((1ULL << 40) - 1)] = 0;
		if (*id_state(id) == ST_RES) victims[nv++] = id;
	}
	if (nv == 0) return;
	if (!st.t_first_evict) st.t_first_evict = t0;

	/* move: contiguous victims go in one run (and one ioctl); staging page k holds victim k. */
	int moved = 0;
	uint64_t t = now_ns();
	while (moved < nv) {
		struct fl_run runs[FL_BATCH];
		int n = 0;
		for (int k = moved; k < nv; k++) {
			uint64_t a = id_addr(victims[k]);
			if (*id_state(victims[k]) != ST_RES)
				die("a page of an eviction batch in flight was discarded: not supported");
			if (n && runs[n - 1].addr + runs[n - 1].len == a) runs[n - 1].len += PG;
			else runs[n++] = (struct fl_run){ a, PG };
		}
		if (moved == 0) st.runs += n;
		uint64_t got = 0, agent_ns = 0;
		int err = fl_move(runs, n, moved, &got, &agent_ns);
		moved += got;
		st.move_agent_ns += agent_ns;
		if (err == EAGAIN) {
			/* An event the program raised waits to be read (a thread's madvise or munmap):
			 * every move fails until it is. */
			drain();
			continue;
		}
		if (err) die("UFFDIO_MOVE: %s (page %d of %d)", strerror(err), moved, nv);
	}
	uint64_t t1 = now_ns();
	st.move_ns += t1 - t;

	/* read the staged pages (readv_ns: process_vm_readv from the pager, nothing in the
	 * program): every one is present (moved), so reading them never faults. */
	const char *staged = fl_staged(nv);
	uint64_t t2 = now_ns();
	st.readv_ns += t2 - t1;

	/* store */
	for (int k = 0; k < nv; k++) {
		struct range *rg = &ranges[victims[k] >> 40];
		uint64_t i = victims[k] & ((1ULL << 40) - 1);
		memcpy(rg->store + i * PG, staged + k * PG, PG);
		rg->state[i] = ST_EVICTED;
	}
	resident -= nv;
	uint64_t t3 = now_ns();
	st.store_ns += t3 - t2;

	/* drop */
	uint64_t drop_agent_ns = 0;
	int derr = fl_drop(nv, &drop_agent_ns);
	if (derr) die("the drop of the staging area: %s", strerror(derr));
	uint64_t t4 = now_ns();
	st.drop_ns += t4 - t3;
	st.drop_agent_ns += drop_agent_ns;
	st.evict_ns += t4 - t0;
	st.evicted += nv;
	st.batches++;
	sample_anon();
}

/* ---- faults */
static char zeros[PG] __attribute__((aligned(4096)));

/* serve installs the page of one fault; 0 when done, -1 when an unread event blocks it
 * (EAGAIN: retried once the events queued are read). */
static int serve(const struct pending *f)
{
	uint64_t idx;
	struct range *r = find(f->addr, &idx);
	if (!r) die("a fault at %#lx outside every registered mapping", (unsigned long)f->addr);
	if (r->state[idx] == ST_RES) {
		/* Installed since this fault was raised (another thread faulted on it first). */
		struct uffdio_range w = { f->addr, PG };
		if (ioctl(uffd, UFFDIO_WAKE, &w) && errno != ENOENT) die("UFFDIO_WAKE: %s", strerror(errno));
		st.wake++;
		return 0;
	}
	uint64_t te = 0;
	if (resident >= cap_pages) {
		uint64_t t = now_ns();
		evict();
		te = now_ns() - t;
	}
	int was = r->state[idx];
	uint64_t ti = now_ns();
	int rc;
	if (was == ST_EVICTED) {
		struct uffdio_copy c = { .dst = f->addr, .src = (uint64_t)(r->store + idx * PG), .len = PG,
					 .mode = split_wake ? UFFDIO_COPY_MODE_DONTWAKE : 0 };
		rc = ioctl(uffd, UFFDIO_COPY, &c);
	} else if (f->flags & UFFD_PAGEFAULT_FLAG_WRITE) {
		struct uffdio_copy c = { .dst = f->addr, .src = (uint64_t)zeros, .len = PG,
					 .mode = split_wake ? UFFDIO_COPY_MODE_DONTWAKE : 0 };
		rc = ioctl(uffd, UFFDIO_COPY, &c);
	} else {
		struct uffdio_zeropage z = { .range = { f->addr, PG }, .mode = split_wake ? UFFDIO_ZEROPAGE_MODE_DONTWAKE : 0 };
		rc = ioctl(uffd, UFFDIO_ZEROPAGE, &z);
	}
	uint64_t t1 = now_ns();
	if (rc == 0 && split_wake) {
		struct uffdio_range w = { f->addr, PG };
		ioctl(uffd, UFFDIO_WAKE, &w);
		st.wake_ns += now_ns() - t1;
	}
	if (rc) {
		if (errno == EAGAIN) return -1;
		if (fl_gone() || errno == ESRCH) return 0;
		die("installing %#lx: %s", (unsigned long)f->addr, strerror(errno));
	}
	r->state[idx] = ST_RES;
	resident++;
	if (!r->queued[idx]) {
		r->queued[idx] = 1;
		fifo[fifo_tail++ % FIFO_CAP] = (uint64_t)(r - ranges) << 40 | idx;
	}
	uint64_t h = t1 - f->t - te; /* the handler's time, the eviction it ran aside */
	if (st.t_first_evict) st.paging++;
	if (was == ST_EVICTED) {
		if (st.refault < NSAMPLES) samples[st.refault] = h > UINT32_MAX ? UINT32_MAX : h;
		st.refault++;
		st.refault_ns += h;
		st.refault_install_ns += t1 - ti;
	} else {
		st.first++;
		st.first_ns += h;
		st.first_install_ns += t1 - ti;
	}
	return 0;
}

static void *fault_main(void *arg)
{
	(void)arg;
	struct uffd_msg msgs[16];
	for (;;) {
		ssize_t n = read(uffd, msgs, sizeof msgs);
		uint64_t t = now_ns();
		fl_busy(1);
		if (n < 0) {
			fl_busy(0);
			if (errno == EINTR || errno == EAGAIN) continue;
			if (fl_gone()) return NULL;
			die("reading the uffd: %s", strerror(errno));
		}
		if (n == 0) return NULL;
		for (int i = 0; i < n / (ssize_t)sizeof msgs[0]; i++) event(&msgs[i], t);
		/* Serve what is queued, in order; a fault an unread event blocks waits for the next read. */
		int k = 0;
		while (k < npend) {
			struct pending f = pend[k];
			if (serve(&f) < 0) {
				drain();
				if (serve(&f) < 0) break;
			}
			k++;
		}
		memmove(pend, pend + k, (npend - k) * sizeof pend[0]);
		npend -= k;
		fl_busy(0);
	}
}

/* ---- registration */
/* do_register registers [addr, addr+len) MISSING|WP on the uffd and publishes its range; 0 or
 * an errno. Registrations are serialized by the caller; the fault thread reads ranges once
 * published (nranges). */
static int do_register(uint64_t addr, uint64_t len)
{
	int n = atomic_load(&nranges);
	if (n == MAX_RANGES) return ENOSPC;
	struct uffdio_register reg = { .range = { addr, len }, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) return errno;
	struct range *r = &ranges[n];
	r->start = addr, r->npages = len / PG;
	r->state = fl_zalloc(r->npages);
	r->queued = fl_zalloc(r->npages);
	/* The store, filled in now: the steady state should not pay the first touch of fresh
	 * memory (costly in a VM: results/prefault.md), which no pager's store pays twice. */
	r->store = fl_store(len);
	if (!r->state || !r->queued || !r->store) return ENOMEM;
	atomic_store(&nranges, n + 1);
	return 0;
}

/* ---- the summary */
static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static double per(uint64_t sum, uint64_t n) { return n ? (double)sum / n : 0; }

/* print_summary prints the one line the harness parses (keys documented in
 * workloads/floor/README.md): counts, then mean ns per fault, per page and per batch. */
static void print_summary(uint64_t t_end, double flush_ns)
{
	uint64_t ns = st.refault < NSAMPLES ? st.refault : NSAMPLES;
	double p50 = 0;
	if (ns) {
		qsort(samples, ns, sizeof samples[0], cmp_u32);
		p50 = samples[ns / 2];
	}
	double secs = st.t_first_evict ? (t_end - st.t_first_evict) / 1e9 : 0;
	uint64_t b = st.batches, e = st.evicted;
	double evict_page = per(st.evict_ns, e), fault = per(st.refault_ns, st.refault);
	fprintf(stderr,
		"floorpager: cap_pages=%lu first_touch=%lu refaults=%lu evicted=%lu batches=%lu discarded=%lu wakes=%lu"
		" pages_per_batch=%.1f runs_per_batch=%.1f secs=%.3f pages_per_sec=%.0f bound_pages_per_sec=%.0f wake_ns=%.0f"
		" fault_ns=%.0f fault_p50_ns=%.0f install_ns=%.0f first_fault_ns=%.0f first_install_ns=%.0f"
		" evict_ns_page=%.0f move_ns_page=%.0f move_ns_batch=%.0f move_agent_ns_page=%.0f"
		" readv_ns_page=%.0f readv_ns_batch=%.0f store_ns_page=%.0f store_ns_batch=%.0f"
		" drop_ns_page=%.0f drop_ns_batch=%.0f drop_agent_ns_batch=%.0f flush_est_ns=%.0f"
		" peak_anon_kib=%lu\n",
		(unsigned long)cap_pages, (unsigned long)st.first, (unsigned long)st.refault, (unsigned long)e, (unsigned long)b,
		(unsigned long)st.discarded, (unsigned long)st.wake, per(e, b), per(st.runs, b), secs,
		secs > 0 ? st.paging / secs : 0, fault + evict_page > 0 && e ? 1e9 / (fault + evict_page) : 0,
		per(st.wake_ns, st.first + st.refault),
		fault, p50, per(st.refault_install_ns, st.refault), per(st.first_ns, st.first), per(st.first_install_ns, st.first),
		evict_page, per(st.move_ns, e), per(st.move_ns, b), per(st.move_agent_ns, e),
		per(st.readv_ns, e), per(st.readv_ns, b), per(st.store_ns, e), per(st.store_ns, b),
		per(st.drop_ns, e), per(st.drop_ns, b), per(st.drop_agent_ns, b), flush_ns,
		(unsigned long)st.peak_anon_kib);
}

#endif
