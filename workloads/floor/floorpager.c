/* floorpager: the floor of userfaultfd paging on this machine, measured. A minimal steady-state
 * pager built the way farmem is (another process serves the program's faults through the uffd
 * its preload shim created and sent over; eviction by the shim's agent thread moving pages into a
 * staging area), with nothing farmem adds beyond that: no prefetch, no dirty tracking (every
 * victim is written), no policy beyond FIFO, a store that is a plain array of page slots.
 *
 *   floorpager --local-mem BYTES [--cpu N] [--combined-wake] -- PROGRAM ARGS...
 *
 * It runs PROGRAM with floorshim.so preloaded (FLOOR_SHIM, or beside this binary), pinned with
 * the pager to one CPU (--cpu, default the last one), as farmem pins its fault thread to the
 * faulting thread's CPU: a wakeup across CPUs costs far more than the round trip itself in this
 * VM. The mappings the shim reports are registered MISSING|WP from here. One fault thread reads
 * the uffd (blocking read) and serves each fault:
 *   - a page never touched (or discarded by the program): UFFDIO_ZEROPAGE for a read, a
 *     UFFDIO_COPY of zeros for a write (a zero page then written costs a second fault);
 *   - an evicted page: UFFDIO_COPY from its slot;
 * and, when the resident pages have reached the cap, first evicts a batch of up to FL_BATCH of
 * the oldest resident pages, inline, while the faulting thread waits anyway:
 *   move (the agent UFFDIO_MOVEs the victims, run by run, into the staging area) ->
 *   process_vm_readv of the staging area into a buffer -> store (memcpy into the slots) ->
 *   drop (the agent madvise(DONTNEED)s the staging area).
 * The staging area's uffd has no events, so the drop needs no REMOVE read; a moved page is out
 * of the program's reach (a fault on it would wait for this thread, which serves it from its
 * slot after the batch), so no write-protection is needed either.
 *
 * At exit it prints on stderr one line of key=value pairs (see print_summary): the counts, the
 * pages paged in per second, and the mean cost of each part. Times are clock_gettime(MONOTONIC)
 * around each step, on this side, and for the agent's syscalls on its side.
 *
 * Not supported, and refused rather than got wrong: fork (EVENT_FORK: the child's evicted
 * pages would read as zeros) and mremap of a registered range (EVENT_REMAP) end the program with
 * an error; a discard of a page inside an eviction batch in flight (possible only with several
 * faulting threads) likewise. munmap and madvise(DONTNEED) of registered memory are followed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

#define PG FL_PAGE
enum { ST_NONE, ST_RES, ST_EVICTED };

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static pid_t child = -1;
static atomic_int child_gone;
/* busy: the fault thread is handling what it read (the program may exit before the counters of
 * the fault that woke it last are updated). */
static atomic_int busy;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "floorpager: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	if (child > 0) kill(child, SIGKILL);
	exit(1);
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

static int uffd = -1, ctl = -1, agent = -1;
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

/* ---- agent requests */
static void agent_call(struct fl_msg *m, const void *extra, size_t elen, uint32_t want)
{
	struct iovec iov[2] = { { m, sizeof *m }, { (void *)extra, elen } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = elen ? 2 : 1 };
	if (sendmsg(agent, &mh, MSG_NOSIGNAL) < 0) die("agent: %s", strerror(errno));
	ssize_t n;
	do n = recv(agent, m, sizeof *m, 0); while (n < 0 && errno == EINTR);
	if (n != sizeof *m || m->type != want) die("agent: no answer (%s)", n < 0 ? strerror(errno) : "closed");
}

/* ---- eviction */
static uint64_t victims[FL_BATCH];
static char bounce[FL_BATCH * PG] __attribute__((aligned(4096)));

static uint64_t id_addr(uint64_t id) { return ranges[id >> 40].start + (id & ((1ULL << 40) - 1)) * PG; }
static uint8_t *id_state(uint64_t id) { return &ranges[id >> 40].state[id & ((1ULL << 40) - 1)]; }

/* sample_anon keeps the program's peak anonymous resident memory (RssAnon), read after each
 * batch, outside its timing: what the pager does not register (glibc's brk heap, thread stacks)
 * is neither paged nor capped here, so the program may hold more than the cap, and the harness
 * reports by how much. */
static void sample_anon(void)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%d/status", (int)child);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
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
		struct fl_msg m = { .type = FL_MOVE, .n = n, .a = moved };
		agent_call(&m, runs, n * sizeof runs[0], FL_MOVE_DONE);
		moved += m.a;
		st.move_agent_ns += m.c;
		if (m.b == EAGAIN) {
			/* An event the program raised waits to be read (a thread's madvise or munmap):
			 * every move fails until it is. */
			drain();
			continue;
		}
		if (m.b) die("UFFDIO_MOVE: %s (page %d of %d)", strerror(m.b), moved, nv);
	}
	uint64_t t1 = now_ns();
	st.move_ns += t1 - t;

	/* readv: every staging page is present (moved), so the read never faults. */
	struct iovec l = { bounce, nv * PG }, r = { (void *)staging, nv * PG };
	ssize_t got = process_vm_readv(child, &l, 1, &r, 1, 0);
	if (got != (ssize_t)(nv * PG)) die("process_vm_readv: %zd of %lu bytes (%s)", got, nv * PG, strerror(errno));
	uint64_t t2 = now_ns();
	st.readv_ns += t2 - t1;

	/* store */
	for (int k = 0; k < nv; k++) {
		struct range *rg = &ranges[victims[k] >> 40];
		uint64_t i = victims[k] & ((1ULL << 40) - 1);
		memcpy(rg->store + i * PG, bounce + k * PG, PG);
		rg->state[i] = ST_EVICTED;
	}
	resident -= nv;
	uint64_t t3 = now_ns();
	st.store_ns += t3 - t2;

	/* drop */
	struct fl_msg m = { .type = FL_DROP, .a = nv };
	agent_call(&m, NULL, 0, FL_DROP_DONE);
	if (m.a) die("the agent's drop of the staging area: %s", strerror(m.a));
	uint64_t t4 = now_ns();
	st.drop_ns += t4 - t3;
	st.drop_agent_ns += m.b;
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
		if (atomic_load(&child_gone) || errno == ESRCH) return 0;
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
		atomic_store(&busy, 1);
		if (n < 0) {
			atomic_store(&busy, 0);
			if (errno == EINTR || errno == EAGAIN) continue;
			if (atomic_load(&child_gone)) return NULL;
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
		atomic_store(&busy, 0);
	}
}

/* ---- registration (the control thread) */
static int do_register(uint64_t addr, uint64_t len)
{
	int n = atomic_load(&nranges);
	if (n == MAX_RANGES) return ENOSPC;
	struct uffdio_register reg = { .range = { addr, len }, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) return errno;
	struct range *r = &ranges[n];
	r->start = addr, r->npages = len / PG;
	r->state = calloc(r->npages, 1);
	r->queued = calloc(r->npages, 1);
	/* The store, populated now: the steady state should not pay the first touch of fresh
	 * guest memory (costly in a VM: docs/DESIGN.md, "Latency"), which no pager's store pays twice. */
	r->store = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (!r->state || !r->queued || r->store == MAP_FAILED) return ENOMEM;
	atomic_store(&nranges, n + 1);
	return 0;
}

static void *ctl_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct fl_msg m;
		ssize_t n = recv(ctl, &m, sizeof m, 0);
		if (n < 0 && errno == EINTR) continue;
		if (n != sizeof m) return NULL; /* the program is gone */
		if (m.type != FL_REGISTER) continue;
		m.a = do_register(m.a, m.b);
		m.type = FL_REGISTER_OK;
		send(ctl, &m, sizeof m, MSG_NOSIGNAL);
	}
}

/* ---- a TLB flush, estimated */

/* flush_estimate times, in a fresh process on this CPU (its mm has run nowhere else, like the
 * pinned program's, so its flushes are local), mprotect flipping one present page to read-only
 * and back against the same flips of an absent page: the difference is two PTE changes and their
 * single-page TLB flushes. The pager's own parts contain such flushes (each page UFFDIO_MOVE
 * moves, one per drop) that no timer can single out. */
static double flush_estimate(void)
{
	int p[2];
	if (pipe(p)) return 0;
	pid_t c = fork();
	if (c == 0) {
		enum { N = 2000 };
		char *b = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		b[0] = 1;
		double best = 1e18;
		for (int rep = 0; rep < 5; rep++) {
			uint64_t t[2];
			for (int w = 0; w < 2; w++) {
				char *pg = b + w * PG;
				uint64_t t0 = now_ns();
				for (int i = 0; i < N; i++) {
					mprotect(pg, PG, PROT_READ);
					mprotect(pg, PG, PROT_READ | PROT_WRITE);
				}
				t[w] = now_ns() - t0;
			}
			double d = ((double)t[0] - (double)t[1]) / (2.0 * N);
			if (d < best) best = d;
		}
		write(p[1], &best, sizeof best);
		_exit(0);
	}
	close(p[1]);
	double v = 0;
	if (read(p[0], &v, sizeof v) != sizeof v) v = 0;
	close(p[0]);
	waitpid(c, NULL, 0);
	return v < 0 ? 0 : v;
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

/* ---- main */
static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	uint64_t m = 1;
	if (!strcmp(end, "") || !strcasecmp(end, "b")) m = 1;
	else if (!strcasecmp(end, "k") || !strcasecmp(end, "kib") || !strcasecmp(end, "kb")) m = 1 << 10;
	else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib") || !strcasecmp(end, "mb")) m = 1 << 20;
	else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib") || !strcasecmp(end, "gb")) m = 1 << 30;
	else return 0;
	if (!(v > 0) || end == s) return 0;
	return (uint64_t)(v * m);
}

static void usage(void)
{
	fprintf(stderr, "usage: floorpager --local-mem BYTES [--cpu N] [--combined-wake] -- PROGRAM ARGS...\n"
			"  BYTES: a number with an optional K, M, G (KiB, MiB, GiB) suffix, at least %lu KiB\n"
			"  --cpu: the CPU the pager and the program run on (default: the last one)\n"
			"  --combined-wake: install and wake in one ioctl (default: the wake apart, timed apart)\n",
		FL_BATCH * PG >> 10);
	exit(2);
}

static int recv_fd(int s, struct fl_msg *m, int *fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { m, sizeof *m };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf };
	ssize_t n;
	do n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
	*fd = -1;
	struct cmsghdr *c = mh.msg_controllen ? CMSG_FIRSTHDR(&mh) : NULL;
	if (n > 0 && c && c->cmsg_type == SCM_RIGHTS) memcpy(fd, CMSG_DATA(c), sizeof(int));
	return n == sizeof *m ? 0 : -1;
}

int main(int argc, char **argv)
{
	uint64_t cap = 0;
	int cpu = -1, i;
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--")) { i++; break; }
		if (!strcmp(argv[i], "--local-mem") && i + 1 < argc) cap = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--cpu") && i + 1 < argc) cpu = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--combined-wake")) split_wake = 0;
		else usage();
	}
	if (i >= argc || cap == 0) usage();
	cap_pages = cap / PG;
	if (cap_pages < FL_BATCH) {
		fprintf(stderr, "floorpager: --local-mem must be at least one batch, %lu KiB\n", FL_BATCH * PG >> 10);
		return 2;
	}

	/* The shim: FLOOR_SHIM, or floorshim.so beside this binary. */
	char shim[PATH_MAX];
	const char *env = getenv(FL_ENV_SHIM);
	if (env) snprintf(shim, sizeof shim, "%s", env);
	else {
		ssize_t n = readlink("/proc/self/exe", shim, sizeof shim - 32);
		if (n <= 0) die("cannot find myself: %s", strerror(errno));
		shim[n] = 0;
		char *slash = strrchr(shim, '/');
		strcpy(slash ? slash + 1 : shim, "floorshim.so");
	}
	if (access(shim, R_OK)) die("the shim %s: %s (set %s)", shim, strerror(errno), FL_ENV_SHIM);

	/* One CPU for the pager and the program, from the start: what they inherit. */
	cpu_set_t set;
	if (cpu < 0) {
		CPU_ZERO(&set);
		sched_getaffinity(0, sizeof set, &set);
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set)) cpu = c;
	}
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set)) die("pinning to CPU %d: %s", cpu, strerror(errno));
	double flush_ns = flush_estimate();
	samples = malloc(NSAMPLES * sizeof *samples);
	fifo = mmap(NULL, FIFO_CAP * sizeof *fifo, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!samples || fifo == MAP_FAILED) die("out of memory");

	int cs[2], as[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, cs) || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, as))
		die("socketpair: %s", strerror(errno));
	pid_t parent = getpid();
	child = fork();
	if (child < 0) die("fork: %s", strerror(errno));
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent) _exit(1);
		/* The child's ends stay open across exec (dup2 clears CLOEXEC). */
		int c = dup2(cs[1], 100), a = dup2(as[1], 101);
		char b[16];
		snprintf(b, sizeof b, "%d", c);
		setenv(FL_ENV_CTL, b, 1);
		snprintf(b, sizeof b, "%d", a);
		setenv(FL_ENV_AGENT, b, 1);
		const char *pre = getenv("LD_PRELOAD");
		char *lp;
		if (asprintf(&lp, "%s%s%s", shim, pre && *pre ? ":" : "", pre ? pre : "") < 0) _exit(127);
		setenv("LD_PRELOAD", lp, 1);
		execvp(argv[i], argv + i);
		fprintf(stderr, "floorpager: %s: %s\n", argv[i], strerror(errno));
		_exit(127);
	}
	close(cs[1]), close(as[1]);
	ctl = cs[0], agent = as[0];
	signal(SIGINT, SIG_IGN), signal(SIGTERM, SIG_IGN); /* they reach the program; we outlive it */

	struct fl_msg m;
	if (recv_fd(ctl, &m, &uffd) || m.type != FL_HELLO || uffd < 0) {
		int ws;
		waitpid(child, &ws, 0);
		child = -1;
		if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127) return 127; /* exec failed: said so */
		die("no hello from the program's shim (is %s loadable by it, statically linked?)", shim);
	}
	m = (struct fl_msg){ .type = FL_HELLO_OK };
	send(ctl, &m, sizeof m, MSG_NOSIGNAL);
	pthread_t tc, tf;
	if (pthread_create(&tc, NULL, ctl_main, NULL)) die("pthread_create");
	if (recv_fd(agent, &m, &(int){ 0 }) || m.type != FL_AGENT_HELLO) die("no hello from the agent");
	if (!m.a) die("the agent has no staging area: %s", strerror((int)m.b));
	staging = m.a;
	if (pthread_create(&tf, NULL, fault_main, NULL)) die("pthread_create");

	int ws;
	while (waitpid(child, &ws, 0) < 0 && errno == EINTR)
		;
	uint64_t t_end = now_ns();
	atomic_store(&child_gone, 1);
	for (int k = 0; k < 1000 && atomic_load(&busy); k++) usleep(1000);
	print_summary(t_end, flush_ns);
	if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
	return WEXITSTATUS(ws);
}
