/*
 * torture.c - farmem integrity torture test.
 *
 * Fills ~N MiB of anonymous memory (private mmap regions + malloc blocks)
 * with self-describing, checksummed units, then for R rounds rewrites,
 * partially updates and verifies them from T threads while the main thread
 * forks, discards (MADV_DONTNEED / MADV_FREE), munmaps, mremaps, frees and
 * reallocates.  Every unit's expected state lives in a malloc'd shadow
 * table; any lost, stale, misplaced or corrupted byte is reported.
 *
 * Build (from the repository root):
 *   gcc -O2 -Wall -pthread -o bin/torture workloads/torture/torture.c
 *
 * See README.md for the CLI, the unit format and what each round does.
 * Exit status: 0 OK, 1 corruption detected, 2 usage error, 3 system error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_FREE
#define MADV_FREE 8
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define PG 4096UL
#define HDR_BYTES 48               /* 6 x u64 header */
#define MIN_UNIT 64
#define MAGIC 0x3130455255545254ULL /* "TRTURE01" */
#define CHILD_BIT (1ULL << 62)     /* generations written by a fork child */
#define FNV_OFF 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
#define GOLD 0x9e3779b97f4a7c15ULL
#define MAX_REPORT 10
#define N_BIG 6
#define N_SMALL 8
#define CHILD_WRITES 32
#define FULL_PASS_EVERY 4

/* header word indices */
enum { H_MAGIC, H_ID, H_GEN, H_COUNTER, H_BSUM, H_HSUM };

enum { K_MMAP, K_MALLOC };
enum { S_INIT, S_NORMAL, S_ZERO, S_OLDZ, S_DEAD };
static const char *const state_name[] = { "init", "normal", "zero", "old-or-zero", "dead" };

enum {
	C_OK,
	C_UNEXPECTED_ZERO,
	C_MAGIC,
	C_ID,
	C_GEN_STALE,
	C_GEN_CHILD,
	C_GEN_OTHER,
	C_COUNTER_LOST,
	C_COUNTER_OTHER,
	C_BODY,
	C_BSUM,
	C_HSUM,
	C_EXPECTED_ZERO,
	C_NOT_OLD_OR_ZERO,
	C_FRESH_NOT_ZERO,
	C_TAIL_NOT_ZERO,
	C_DONTNEED_NOT_ZERO,
};
static const char *const check_name[] = {
	"ok",
	"unexpected-zero(lost page)",
	"magic",
	"id(misplaced page/block)",
	"gen(stale)",
	"gen(child-write-leaked)",
	"gen(mismatch)",
	"counter(lost small write)",
	"counter(mismatch)",
	"body",
	"body-checksum-field",
	"header-checksum",
	"expected-zero",
	"not-old-or-zero(after MADV_FREE)",
	"fresh-mmap-not-zero",
	"mremap-tail-not-zero",
	"dontneed-not-zero",
};

enum { INJ_NONE, INJ_BYTE, INJ_STALE, INJ_ZERO, INJ_COUNTER, INJ_CHILD };

struct unit {
	uint8_t *ptr;
	uint64_t id;      /* unique, stored in the header */
	uint64_t gen;     /* authoritative expected generation */
	uint64_t counter; /* authoritative expected counter field */
	uint32_t len;     /* bytes, multiple of 8, >= MIN_UNIT */
	uint32_t page;    /* page index within region (mmap units) */
	int32_t region;   /* region index, -1 for malloc blocks */
	uint16_t owner;   /* worker that owns it */
	uint8_t kind;
	uint8_t state;
};

struct region {
	uint8_t *addr;
	size_t npages;
	int small;
	int live;
};

struct found {
	uint64_t magic, id, gen, counter;
	long off;
};

struct wstat {
	uint64_t writes, verified;
	char pad[48];
};

/* ---- options ---- */
static uint64_t o_seed = 1;
static unsigned long o_mib = 256;
static int o_threads = 2;
static int o_rounds = 20;
static int o_quiet;
static int o_inject;

/* ---- state ---- */
static struct unit *U;
static size_t nU, capU;
static struct region *RG;
static size_t nRG, capRG;
static uint64_t next_id = 1;
static uint64_t seedmix;

static uint64_t g_bad;
static int g_in_child;
static pthread_mutex_t g_rep_lock = PTHREAD_MUTEX_INITIALIZER;

static struct wstat *WS;  /* one per worker */
static uint64_t m_writes, m_verified, m_forks;

static pthread_barrier_t bar_start, bar_end;
enum { PH_INIT, PH_ROUND, PH_QUIT };
static int g_phase, g_round;

static pid_t child_pid;
static int child_round;
static size_t child_units[CHILD_WRITES];
static int n_child_units;

static int mremap_count;
static int madv_free_supported = 1;
static char opdesc[256];

/* ------------------------------------------------------------------ */

static inline uint64_t fmix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline uint64_t rng_next(uint64_t *s)
{
	*s += GOLD;
	return fmix(*s);
}

static inline uint64_t rng_below(uint64_t *s, uint64_t n)
{
	return n ? rng_next(s) % n : 0;
}

static uint64_t rng_for(uint64_t a, uint64_t b, uint64_t c)
{
	return fmix(seedmix ^ fmix(a + GOLD) ^ fmix(b * 0x632be59bd9b4e019ULL + c));
}

static inline uint64_t xs64(uint64_t s)
{
	s ^= s << 13;
	s ^= s >> 7;
	s ^= s << 17;
	return s;
}

static inline uint64_t body_seed(uint64_t id, uint64_t gen)
{
	uint64_t s = fmix(fmix(id ^ seedmix) ^ (gen * 0xd1b54a32d192ed03ULL));
	return s ? s : 1;
}

static inline uint64_t hdr_sum(uint64_t id, uint64_t gen, uint64_t counter, uint64_t bsum)
{
	return fmix(fmix(fmix(fmix(id ^ MAGIC) ^ gen) ^ counter) ^ bsum);
}

static void die(const char *what)
{
	fprintf(stderr, "torture: ERROR %s: %s\n", what, strerror(errno));
	exit(3);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n);
	if (!p)
		die("malloc");
	return p;
}

static double now_sec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

#define CBAR() __asm__ __volatile__("" ::: "memory")

/* ---- unit memory format ---- */

static void fill_mem(uint8_t *ptr, uint32_t len, uint64_t id, uint64_t gen)
{
	uint64_t *p = (uint64_t *)(void *)ptr;
	uint64_t *body = p + HDR_BYTES / 8;
	size_t nw = (len - HDR_BYTES) / 8;
	uint64_t s = body_seed(id, gen), h = FNV_OFF;

	for (size_t i = 0; i < nw; i++) {
		s = xs64(s);
		body[i] = s;
		h = (h ^ s) * FNV_PRIME;
	}
	p[H_MAGIC] = MAGIC;
	p[H_ID] = id;
	p[H_GEN] = gen;
	p[H_COUNTER] = 0;
	p[H_BSUM] = h;
	p[H_HSUM] = hdr_sum(id, gen, 0, h);
}

static int is_zero(const uint8_t *ptr, size_t len)
{
	const uint64_t *p = (const uint64_t *)(const void *)ptr;
	uint64_t acc = 0;
	for (size_t i = 0; i < len / 8; i++)
		acc |= p[i];
	return acc == 0;
}

/* Verify len bytes at ptr hold unit (id, gen, counter).  If check_bsum is 0
 * (truncated prefix after a shrinking realloc) the body checksum is skipped. */
static int verify_mem(const uint8_t *ptr, uint32_t len, uint64_t id, uint64_t gen,
		      uint64_t counter, int check_bsum, struct found *f)
{
	const uint64_t *p = (const uint64_t *)(const void *)ptr;
	const uint64_t *body = p + HDR_BYTES / 8;
	size_t nw = (len - HDR_BYTES) / 8;

	f->magic = p[H_MAGIC];
	f->id = p[H_ID];
	f->gen = p[H_GEN];
	f->counter = p[H_COUNTER];
	f->off = -1;
	if (f->magic != MAGIC)
		return is_zero(ptr, len) ? C_UNEXPECTED_ZERO : C_MAGIC;
	if (f->id != id)
		return C_ID;
	if (f->gen != gen) {
		if ((f->gen & CHILD_BIT) && !(gen & CHILD_BIT))
			return C_GEN_CHILD;
		return f->gen < gen ? C_GEN_STALE : C_GEN_OTHER;
	}
	if (f->counter != counter)
		return f->counter < counter ? C_COUNTER_LOST : C_COUNTER_OTHER;

	uint64_t s = body_seed(id, gen), h = FNV_OFF;
	size_t first = (size_t)-1;
	for (size_t i = 0; i < nw; i++) {
		uint64_t w = body[i];
		s = xs64(s);
		h = (h ^ w) * FNV_PRIME;
		if (w != s && first == (size_t)-1)
			first = i;
	}
	if (first != (size_t)-1) {
		f->off = (long)(HDR_BYTES + first * 8);
		return C_BODY;
	}
	if (check_bsum && h != p[H_BSUM])
		return C_BSUM;
	if (p[H_HSUM] != hdr_sum(id, gen, counter, p[H_BSUM])) {
		f->off = H_HSUM * 8;
		return C_HSUM;
	}
	return C_OK;
}

/* ---- reporting ---- */

static void report(const char *ctx, size_t idx, int code, const struct found *f)
{
	uint64_t n = __atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
	if (n > MAX_REPORT)
		return;
	const struct unit *u = &U[idx];
	pthread_mutex_lock(&g_rep_lock);
	fprintf(stderr,
		"torture: BAD%s #%" PRIu64 " ctx=%s unit=%zu id=%" PRIu64
		" kind=%s region=%d page=%u addr=%p len=%u state=%s check=%s"
		" expected_gen=%" PRIu64 " found_gen=%" PRIu64,
		g_in_child ? " [fork-child]" : "", n, ctx, idx, u->id,
		u->kind == K_MMAP ? "mmap" : "malloc", u->region, u->page,
		(void *)u->ptr, u->len, state_name[u->state], check_name[code], u->gen,
		f ? f->gen : 0);
	if (f) {
		if (code == C_ID)
			fprintf(stderr, " found_id=%" PRIu64, f->id);
		if (code == C_MAGIC)
			fprintf(stderr, " found_magic=%#" PRIx64, f->magic);
		if (code == C_COUNTER_LOST || code == C_COUNTER_OTHER)
			fprintf(stderr, " expected_counter=%" PRIu64 " found_counter=%" PRIu64,
				u->counter, f->counter);
		if (f->off >= 0)
			fprintf(stderr, " off=%ld", f->off);
	}
	fputc('\n', stderr);
	if (n == MAX_REPORT)
		fprintf(stderr, "torture: (further BAD details suppressed)\n");
	pthread_mutex_unlock(&g_rep_lock);
}

static void report_zero_check(const char *ctx, size_t idx, int code)
{
	struct found f;
	const uint64_t *p = (const uint64_t *)(const void *)U[idx].ptr;
	memset(&f, 0, sizeof f);
	f.magic = p[H_MAGIC];
	f.id = p[H_ID];
	f.gen = p[H_GEN];
	f.counter = p[H_COUNTER];
	f.off = -1;
	report(ctx, idx, code, &f);
}

/* ---- unit operations ---- */

static void write_unit(size_t idx, uint64_t gen)
{
	struct unit *u = &U[idx];
	fill_mem(u->ptr, u->len, u->id, gen);
	u->gen = gen;
	u->counter = 0;
	u->state = S_NORMAL;
}

/* Check a unit against the shadow according to its state. Returns 1 if OK. */
static int check_unit(size_t idx, const char *ctx)
{
	struct unit *u = &U[idx];
	struct found f;
	int code;

	switch (u->state) {
	case S_NORMAL:
		code = verify_mem(u->ptr, u->len, u->id, u->gen, u->counter, 1, &f);
		if (code != C_OK) {
			report(ctx, idx, code, &f);
			return 0;
		}
		return 1;
	case S_ZERO:
		if (!is_zero(u->ptr, u->len)) {
			report_zero_check(ctx, idx, C_EXPECTED_ZERO);
			return 0;
		}
		return 1;
	case S_OLDZ:
		if (is_zero(u->ptr, u->len))
			return 1;
		code = verify_mem(u->ptr, u->len, u->id, u->gen, u->counter, 1, &f);
		if (code == C_OK)
			return 1;
		CBAR();
		/* the kernel may have reclaimed the page while we were reading it */
		if (is_zero(u->ptr, u->len))
			return 1;
		report(ctx, idx, C_NOT_OLD_OR_ZERO, &f);
		return 0;
	default:
		return 1;
	}
}

/* Increment the counter field in place: one 8-byte store plus the header
 * checksum store.  Catches lost small writes. */
static int counter_inc(size_t idx)
{
	struct unit *u = &U[idx];
	volatile uint64_t *p = (volatile uint64_t *)(void *)u->ptr;

	if (p[H_MAGIC] != MAGIC || p[H_ID] != u->id || p[H_GEN] != u->gen ||
	    p[H_COUNTER] != u->counter) {
		check_unit(idx, "counter-inc");
		return 0;
	}
	uint64_t c = u->counter + 1;
	p[H_COUNTER] = c;
	p[H_HSUM] = hdr_sum(u->id, u->gen, c, p[H_BSUM]);
	u->counter = c;
	return 1;
}

static size_t unit_add(uint8_t *ptr, uint32_t len, int kind, int region, uint32_t page, int owner)
{
	if (nU == capU) {
		capU = capU ? capU * 2 : 4096;
		U = realloc(U, capU * sizeof *U);
		if (!U)
			die("realloc(shadow)");
	}
	struct unit *u = &U[nU];
	memset(u, 0, sizeof *u);
	u->ptr = ptr;
	u->len = len;
	u->kind = (uint8_t)kind;
	u->region = region;
	u->page = page;
	u->owner = (uint16_t)owner;
	u->id = next_id++;
	u->state = S_INIT;
	return nU++;
}

static int region_add(uint8_t *addr, size_t npages, int small)
{
	if (nRG == capRG) {
		capRG = capRG ? capRG * 2 : 32;
		RG = realloc(RG, capRG * sizeof *RG);
		if (!RG)
			die("realloc(regions)");
	}
	RG[nRG].addr = addr;
	RG[nRG].npages = npages;
	RG[nRG].small = small;
	RG[nRG].live = 1;
	return (int)nRG++;
}

static uint8_t *map_anon(size_t npages)
{
	void *p = mmap(NULL, npages * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

static uint32_t malloc_len(uint64_t *rs)
{
	uint64_t r = rng_below(rs, 100), len;
	if (r < 3)
		len = 256 * 1024 + rng_below(rs, 768 * 1024 + 1); /* 256 KiB .. 1 MiB: glibc mmap */
	else if (r < 83)
		len = 4096 + rng_below(rs, 60 * 1024 + 1);        /* 4 .. 64 KiB: heap/arena */
	else
		len = 64 + rng_below(rs, 4096 - 64);              /* sub-page, shares pages */
	len &= ~7ULL;
	if (len < MIN_UNIT)
		len = MIN_UNIT;
	return (uint32_t)len;
}

static uint64_t verify_all(const char *ctx)
{
	uint64_t bad = 0;
	for (size_t i = 0; i < nU; i++) {
		if (U[i].state == S_DEAD || U[i].state == S_INIT)
			continue;
		if (!check_unit(i, ctx))
			bad++;
		m_verified++;
	}
	return bad;
}

/* ---- workers ---- */

static void worker_round(int w, size_t *list, size_t n, int round)
{
	uint64_t rs = rng_for(0x1000 + (uint64_t)round, (uint64_t)w, 17);
	struct wstat *st = &WS[w];

	for (size_t i = n; i > 1; i--) {
		size_t j = rng_below(&rs, i);
		size_t t = list[i - 1];
		list[i - 1] = list[j];
		list[j] = t;
	}
	for (size_t k = 0; k < n; k++) {
		size_t idx = list[k];
		struct unit *u = &U[idx];
		uint64_t r = rng_below(&rs, 100);

		switch (u->state) {
		case S_NORMAL:
			if (r < 30) {
				write_unit(idx, u->gen + 1);
				st->writes++;
			} else if (r < 60) {
				check_unit(idx, "worker-verify");
				st->verified++;
			} else if (r < 68) {
				int times = 1 + (int)(r % 3);
				for (int t = 0; t < times; t++) {
					if (!counter_inc(idx))
						break;
					st->writes++;
				}
			}
			break;
		case S_ZERO:
			if (r < 30) {
				write_unit(idx, u->gen + 1);
				st->writes++;
			} else if (r < 60) {
				check_unit(idx, "worker-verify-zero");
				st->verified++;
			}
			break;
		case S_OLDZ:
			check_unit(idx, "worker-madv-free");
			st->verified++;
			write_unit(idx, u->gen + 1);
			st->writes++;
			break;
		default:
			break;
		}
	}
}

static void *worker(void *arg)
{
	int w = (int)(intptr_t)arg;
	size_t *list = NULL, cap = 0;

	for (;;) {
		pthread_barrier_wait(&bar_start);
		if (g_phase == PH_QUIT)
			break;
		if (cap < nU) {
			cap = nU + nU / 2 + 64;
			free(list);
			list = xmalloc(cap * sizeof *list);
		}
		size_t n = 0;
		for (size_t i = 0; i < nU; i++)
			if (U[i].owner == w && U[i].state != S_DEAD)
				list[n++] = i;
		if (g_phase == PH_INIT) {
			for (size_t k = 0; k < n; k++) {
				struct unit *u = &U[list[k]];
				if (u->state != S_INIT)
					continue;
				if (u->kind == K_MALLOC) {
					u->ptr = malloc(u->len); /* this thread's arena */
					if (!u->ptr)
						die("malloc");
				}
				write_unit(list[k], 1);
				WS[w].writes++;
			}
		} else {
			worker_round(w, list, n, g_round);
		}
		pthread_barrier_wait(&bar_end);
	}
	free(list);
	return NULL;
}

static void run_phase(int phase, int round)
{
	g_phase = phase;
	g_round = round;
	pthread_barrier_wait(&bar_start);
	pthread_barrier_wait(&bar_end);
}

/* ---- helpers for main-thread ops ---- */

static int pick_region(uint64_t *rs, int small_only, int exclude, size_t min_pages)
{
	int cand[4096];
	int n = 0;
	for (size_t i = 0; i < nRG && n < 4096; i++) {
		if (!RG[i].live || (small_only && !RG[i].small) || (int)i == exclude ||
		    RG[i].npages < min_pages)
			continue;
		cand[n++] = (int)i;
	}
	if (!n)
		return -1;
	return cand[rng_below(rs, (uint64_t)n)];
}

static size_t pick_normal_unit(uint64_t *rs)
{
	for (int tries = 0; tries < 100000; tries++) {
		size_t i = rng_below(rs, nU);
		if (U[i].state == S_NORMAL)
			return i;
	}
	return (size_t)-1;
}

static void add_region_units(int ri, size_t from, size_t to, uint64_t *rs, const char *zctx, int zcode)
{
	for (size_t pg = from; pg < to; pg++) {
		size_t idx = unit_add(RG[ri].addr + pg * PG, PG, K_MMAP, ri, (uint32_t)pg,
				      (int)rng_below(rs, (uint64_t)o_threads));
		if (!is_zero(U[idx].ptr, PG))
			report_zero_check(zctx, idx, zcode);
		m_verified++;
		write_unit(idx, 1);
		m_writes++;
	}
}

/* ---- round ops ---- */

static void child_main(int round)
{
	uint64_t rs = rng_for(0x3000 + (uint64_t)round, 1, 2);
	char ctx[64];

	g_in_child = 1;
	g_bad = 0;
	/* child-private writes: the parent must never see them */
	for (int i = 0; i < n_child_units; i++) {
		size_t idx = child_units[i];
		write_unit(idx, (U[idx].gen + 1) | CHILD_BIT);
	}
	if (o_inject == INJ_CHILD) {
		size_t idx = pick_normal_unit(&rs);
		if (idx != (size_t)-1)
			U[idx].ptr[rng_below(&rs, U[idx].len)] ^= 0x40;
	}
	snprintf(ctx, sizeof ctx, "fork-child(round %d)", round);
	uint64_t bad = verify_all(ctx);
	if (bad)
		fprintf(stderr, "torture: fork child (round %d) found bad=%" PRIu64 "\n", round, bad);
	fflush(stderr);
	_exit(bad ? 1 : 0);
}

static void op_fork(int round, uint64_t *rs)
{
	n_child_units = 0;
	for (int i = 0; i < CHILD_WRITES; i++) {
		size_t idx = pick_normal_unit(rs);
		if (idx != (size_t)-1)
			child_units[n_child_units++] = idx;
	}
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0)
		child_main(round);
	child_pid = pid;
	child_round = round;
	m_forks++;
	snprintf(opdesc, sizeof opdesc, "fork pid=%d child_writes=%d", (int)pid, n_child_units);
}

static void finish_child(void)
{
	int st;
	pid_t r;

	do
		r = waitpid(child_pid, &st, 0);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		die("waitpid");
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		__atomic_add_fetch(&g_bad, 1, __ATOMIC_RELAXED);
		if (WIFEXITED(st))
			fprintf(stderr, "torture: BAD fork child of round %d exited with status %d\n",
				child_round, WEXITSTATUS(st));
		else
			fprintf(stderr, "torture: BAD fork child of round %d killed by signal %d\n",
				child_round, WIFSIGNALED(st) ? WTERMSIG(st) : -1);
	}
	/* the child's private writes must not be visible here */
	for (int i = 0; i < n_child_units; i++) {
		check_unit(child_units[i], "fork-isolation");
		m_verified++;
	}
	child_pid = 0;
}

static void op_madvise(uint64_t *rs)
{
	int ri = pick_region(rs, 0, -1, 1);
	size_t np = RG[ri].npages;
	size_t cnt = 1 + rng_below(rs, 16);
	if (cnt > np)
		cnt = np;
	size_t start = rng_below(rs, np - cnt + 1);
	if (madvise(RG[ri].addr + start * PG, cnt * PG, MADV_DONTNEED) != 0)
		die("madvise(MADV_DONTNEED)");
	for (size_t i = 0; i < nU; i++) {
		struct unit *u = &U[i];
		if (u->region != ri || u->state == S_DEAD || u->page < start || u->page >= start + cnt)
			continue;
		if (!is_zero(u->ptr, u->len))
			report_zero_check("after-MADV_DONTNEED", i, C_DONTNEED_NOT_ZERO);
		m_verified++;
		u->state = S_ZERO;
	}
	int n = snprintf(opdesc, sizeof opdesc, "madvise DONTNEED region=%d pages=[%zu,+%zu)", ri, start, cnt);

	int rj = pick_region(rs, 0, ri, 1);
	if (rj < 0)
		rj = ri;
	np = RG[rj].npages;
	cnt = 1 + rng_below(rs, 16);
	if (cnt > np)
		cnt = np;
	start = rng_below(rs, np - cnt + 1);
	if (!madv_free_supported)
		return;
	if (madvise(RG[rj].addr + start * PG, cnt * PG, MADV_FREE) != 0) {
		if (errno != EINVAL)
			die("madvise(MADV_FREE)");
		madv_free_supported = 0;
		snprintf(opdesc + n, sizeof opdesc - (size_t)n, " (MADV_FREE unsupported)");
		return;
	}
	for (size_t i = 0; i < nU; i++) {
		struct unit *u = &U[i];
		if (u->region != rj || u->state == S_DEAD || u->page < start || u->page >= start + cnt)
			continue;
		if (u->state == S_NORMAL)
			u->state = S_OLDZ;
		check_unit(i, "after-MADV_FREE");
		m_verified++;
	}
	snprintf(opdesc + n, sizeof opdesc - (size_t)n, ", FREE region=%d pages=[%zu,+%zu)", rj, start, cnt);
}

static void op_munmap(uint64_t *rs)
{
	int n = 0;
	/* partial munmap: trim the tail quarter of a small region (splits VMAs) */
	int rt = pick_region(rs, 1, -1, 8);
	if (rt >= 0) {
		size_t np = RG[rt].npages, trim = np / 4, keep = np - trim;
		for (size_t i = 0; i < nU; i++) {
			if (U[i].region != rt || U[i].state == S_DEAD || U[i].page < keep)
				continue;
			check_unit(i, "pre-munmap-trim");
			m_verified++;
			U[i].state = S_DEAD;
		}
		if (munmap(RG[rt].addr + keep * PG, trim * PG) != 0)
			die("munmap(trim)");
		RG[rt].npages = keep;
		n = snprintf(opdesc, sizeof opdesc, "munmap trim region=%d %zu->%zu pages; ", rt, np, keep);
	}

	/* full munmap of a small region, then a fresh mmap of a different size */
	int ri = pick_region(rs, 1, -1, 1);
	if (ri < 0)
		return;
	size_t oldn = RG[ri].npages;
	for (size_t i = 0; i < nU; i++) {
		if (U[i].region != ri || U[i].state == S_DEAD)
			continue;
		check_unit(i, "pre-munmap");
		m_verified++;
		U[i].state = S_DEAD;
	}
	if (munmap(RG[ri].addr, oldn * PG) != 0)
		die("munmap");
	RG[ri].live = 0;

	size_t newn = oldn * (50 + rng_below(rs, 101)) / 100;
	if (newn == oldn)
		newn++;
	if (newn < 2)
		newn = 2;
	uint8_t *a = map_anon(newn);
	int rn = region_add(a, newn, 1);
	add_region_units(rn, 0, newn, rs, "fresh-mmap", C_FRESH_NOT_ZERO);
	snprintf(opdesc + n, sizeof opdesc - (size_t)n,
		 "munmap region=%d (%zu pages) -> new region=%d (%zu pages)", ri, oldn, rn, newn);
}

static void op_mremap(uint64_t *rs)
{
	int ri = pick_region(rs, 1, -1, 1);
	if (ri < 0)
		return;
	uint8_t *old = RG[ri].addr;
	size_t oldn = RG[ri].npages;
	size_t newn = oldn + oldn * (25 + rng_below(rs, 26)) / 100;
	if (newn == oldn)
		newn++;
	size_t oldlen = oldn * PG, newlen = newn * PG;
	void *na;
	const char *how;

	if (mremap_count++ % 2 == 0) {
		/* MREMAP_FIXED into a freshly reserved range */
		void *resv = mmap(NULL, newlen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (resv == MAP_FAILED)
			die("mmap(reserve)");
		na = mremap(old, oldlen, newlen, MREMAP_MAYMOVE | MREMAP_FIXED, resv);
		if (na == MAP_FAILED)
			die("mremap(MREMAP_FIXED)");
		how = "FIXED";
	} else {
		/* block in-place growth with a guard page, then MREMAP_MAYMOVE */
		void *want = old + oldlen;
		void *guard = mmap(want, PG, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (guard != MAP_FAILED && guard != want) {
			munmap(guard, PG);
			guard = MAP_FAILED;
		}
		na = mremap(old, oldlen, newlen, MREMAP_MAYMOVE);
		if (na == MAP_FAILED)
			die("mremap(MREMAP_MAYMOVE)");
		if (guard != MAP_FAILED)
			munmap(guard, PG);
		how = "MAYMOVE";
	}
	RG[ri].addr = na;
	RG[ri].npages = newn;
	for (size_t i = 0; i < nU; i++) {
		if (U[i].region != ri || U[i].state == S_DEAD)
			continue;
		U[i].ptr = RG[ri].addr + (size_t)U[i].page * PG;
		check_unit(i, "post-mremap");
		m_verified++;
	}
	add_region_units(ri, oldn, newn, rs, "mremap-tail", C_TAIL_NOT_ZERO);
	snprintf(opdesc, sizeof opdesc, "mremap %s region=%d %zu->%zu pages %p->%p%s", how, ri, oldn,
		 newn, (void *)old, na, na == (void *)old ? " (in place)" : " (moved)");
}

static void op_malloc(uint64_t *rs)
{
	size_t *live = xmalloc((nU + 1) * sizeof *live);
	size_t n = 0;
	for (size_t i = 0; i < nU; i++)
		if (U[i].kind == K_MALLOC && U[i].state != S_DEAD)
			live[n++] = i;
	if (!n) {
		free(live);
		return;
	}
	size_t nfree = n / 10 ? n / 10 : 1;
	size_t nre = n / 50 ? n / 50 : 1;
	/* partial shuffle: first nfree are freed, next nre are realloc'd */
	for (size_t i = 0; i < nfree + nre && i < n; i++) {
		size_t j = i + rng_below(rs, n - i);
		size_t t = live[i];
		live[i] = live[j];
		live[j] = t;
	}
	uint64_t freed = 0, allocated = 0;
	size_t nalloc = 0, k = 0;
	for (; k < nfree && k < n; k++) {
		size_t idx = live[k];
		check_unit(idx, "pre-free");
		m_verified++;
		freed += U[idx].len;
		free(U[idx].ptr);
		U[idx].ptr = NULL;
		U[idx].state = S_DEAD;
	}
	for (; k < nfree + nre && k < n; k++) {
		size_t idx = live[k];
		struct unit *u = &U[idx];
		struct found f;
		check_unit(idx, "pre-realloc");
		m_verified++;
		uint32_t oldlen = u->len, newlen;
		int grow = rng_below(rs, 2) == 0;
		if (grow)
			newlen = oldlen + (uint32_t)((uint64_t)oldlen * (10 + rng_below(rs, 91)) / 100);
		else
			newlen = (uint32_t)((uint64_t)oldlen * (30 + rng_below(rs, 61)) / 100);
		newlen &= ~7U;
		if (newlen > (4U << 20))
			newlen = 4U << 20;
		if (newlen < MIN_UNIT)
			newlen = MIN_UNIT;
		uint8_t *p = realloc(u->ptr, newlen);
		if (!p)
			die("realloc");
		u->ptr = p;
		if (u->state == S_NORMAL) {
			uint32_t vlen = newlen < oldlen ? newlen : oldlen;
			int code = verify_mem(p, vlen, u->id, u->gen, u->counter, vlen == oldlen, &f);
			if (code != C_OK)
				report("post-realloc", idx, code, &f);
			m_verified++;
		}
		u->len = newlen;
		write_unit(idx, u->gen + 1);
		m_writes++;
	}
	while (allocated < freed) {
		uint32_t len = malloc_len(rs);
		uint8_t *p = malloc(len);
		if (!p)
			die("malloc");
		size_t idx = unit_add(p, len, K_MALLOC, -1, 0, (int)rng_below(rs, (uint64_t)o_threads));
		write_unit(idx, 1);
		m_writes++;
		allocated += len;
		nalloc++;
	}
	snprintf(opdesc, sizeof opdesc, "free %zu blocks (%" PRIu64 " KiB), realloc %zu, malloc %zu (%" PRIu64 " KiB)",
		 nfree < n ? nfree : n, freed >> 10, nre, nalloc, allocated >> 10);
	free(live);
}

/* ---- corruption injection (self-test of the checker) ---- */

static void inject(uint64_t *rs)
{
	size_t idx = pick_normal_unit(rs);
	if (idx == (size_t)-1)
		return;
	struct unit *u = &U[idx];
	const char *what = "";

	switch (o_inject) {
	case INJ_BYTE: {
		size_t off = rng_below(rs, u->len);
		u->ptr[off] ^= (uint8_t)(1u << rng_below(rs, 8));
		what = "flipped one bit";
		break;
	}
	case INJ_STALE: {
		/* write a new generation, then put the old bytes back: a lost write-back */
		uint8_t *save = xmalloc(u->len);
		memcpy(save, u->ptr, u->len);
		write_unit(idx, u->gen + 1);
		memcpy(u->ptr, save, u->len);
		free(save);
		what = "reverted to stale generation";
		break;
	}
	case INJ_ZERO:
		memset(u->ptr, 0, u->len);
		what = "zeroed (lost page)";
		break;
	case INJ_COUNTER: {
		uint64_t *p = (uint64_t *)(void *)u->ptr;
		uint64_t c = p[H_COUNTER];
		counter_inc(idx);
		p[H_COUNTER] = c;
		what = "lost counter increment";
		break;
	}
	default:
		return;
	}
	if (!o_quiet)
		fprintf(stderr, "torture: injected corruption into unit %zu (%s)\n", idx, what);
}

/* ---- /proc/self/status ---- */

static void read_status(long *rss_anon, long *vmrss, long *vmhwm)
{
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");
	*rss_anon = *vmrss = *vmhwm = -1;
	if (!f)
		return;
	while (fgets(line, sizeof line, f)) {
		if (!strncmp(line, "RssAnon:", 8))
			*rss_anon = strtol(line + 8, NULL, 10);
		else if (!strncmp(line, "VmRSS:", 6))
			*vmrss = strtol(line + 6, NULL, 10);
		else if (!strncmp(line, "VmHWM:", 6))
			*vmhwm = strtol(line + 6, NULL, 10);
	}
	fclose(f);
}

/* ---- CLI ---- */

static void usage(FILE *f)
{
	fprintf(f,
		"usage: torture [--mib N] [--threads T] [--rounds R] [--seed S] [--quiet]\n"
		"  --mib N      approximate footprint in MiB (default 256)\n"
		"  --threads T  worker threads (default 2)\n"
		"  --rounds R   rounds (default 20)\n"
		"  --seed S     seed for all content and choices (default 1)\n"
		"  --quiet      print only the final lines\n");
}

static int parse_num(const char *s, unsigned long long lo, unsigned long long hi, unsigned long long *out)
{
	char *end;
	if (!s || !*s || *s == '-')
		return -1;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

static void parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *val = NULL;
		char name[64];
		const char *eq = strchr(a, '=');
		if (eq && (size_t)(eq - a) < sizeof name) {
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = 0;
			val = eq + 1;
		} else {
			snprintf(name, sizeof name, "%s", a);
		}
		unsigned long long v;
		if (!strcmp(name, "--help") || !strcmp(name, "-h")) {
			usage(stdout);
			exit(0);
		} else if (!strcmp(name, "--quiet") && !val) {
			o_quiet = 1;
		} else if (!strcmp(name, "--inject-corruption")) {
			if (!val || !strcmp(val, "byte"))
				o_inject = INJ_BYTE;
			else if (!strcmp(val, "stale"))
				o_inject = INJ_STALE;
			else if (!strcmp(val, "zero"))
				o_inject = INJ_ZERO;
			else if (!strcmp(val, "counter"))
				o_inject = INJ_COUNTER;
			else if (!strcmp(val, "child"))
				o_inject = INJ_CHILD;
			else
				goto bad;
		} else if (!strcmp(name, "--mib") || !strcmp(name, "--threads") ||
			   !strcmp(name, "--rounds") || !strcmp(name, "--seed")) {
			if (!val) {
				if (i + 1 >= argc)
					goto bad;
				val = argv[++i];
			}
			if (!strcmp(name, "--mib")) {
				if (parse_num(val, 1, 1ULL << 20, &v))
					goto bad;
				o_mib = (unsigned long)v;
			} else if (!strcmp(name, "--threads")) {
				if (parse_num(val, 1, 256, &v))
					goto bad;
				o_threads = (int)v;
			} else if (!strcmp(name, "--rounds")) {
				if (parse_num(val, 0, 1000000, &v))
					goto bad;
				o_rounds = (int)v;
			} else {
				if (parse_num(val, 0, ~0ULL, &v))
					goto bad;
				o_seed = v;
			}
		} else {
			goto bad;
		}
		continue;
bad:
		if (val)
			fprintf(stderr, "torture: bad value '%s' for %s\n", val, name);
		else
			fprintf(stderr, "torture: bad argument '%s'\n", a);
		usage(stderr);
		exit(2);
	}
}

/* ------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	static const char *const opnames[] = { "fork", "madvise", "munmap", "mremap", "malloc" };
	long rss_anon, vmrss, vmhwm, peak_anon = 0;
	double t0 = now_sec();

	parse_args(argc, argv);
	seedmix = fmix(o_seed ^ 0x746f727475726521ULL) ^ o_seed;

	/* ---- layout ---- */
	size_t total = (size_t)o_mib * (1024 * 1024 / PG);
	size_t big_pages = total * 60 / 100, small_pages = total * 10 / 100;
	uint64_t malloc_bytes = (uint64_t)(total - big_pages - small_pages) * PG;
	uint64_t rs = rng_for(0x2000, 0, 0);
	static const unsigned bw[N_BIG] = { 3, 5, 7, 11, 13, 17 };
	unsigned bsum = 0;
	for (int i = 0; i < N_BIG; i++)
		bsum += bw[i];

	capU = total + total / 4 + 1024;
	U = xmalloc(capU * sizeof *U);

	size_t left = big_pages;
	for (int i = 0; i < N_BIG; i++) {
		size_t np = i == N_BIG - 1 ? left : big_pages * bw[i] / bsum;
		if (np < 1)
			np = 1;
		if (left >= np)
			left -= np;
		int ri = region_add(map_anon(np), np, 0);
		for (size_t pg = 0; pg < np; pg++)
			unit_add(RG[ri].addr + pg * PG, PG, K_MMAP, ri, (uint32_t)pg,
				 (int)rng_below(&rs, (uint64_t)o_threads));
	}
	unsigned sw[N_SMALL], ssum = 0;
	for (int i = 0; i < N_SMALL; i++)
		ssum += sw[i] = 1 + (unsigned)rng_below(&rs, 8);
	for (int i = 0; i < N_SMALL; i++) {
		size_t np = small_pages * sw[i] / ssum;
		if (np < 2)
			np = 2;
		int ri = region_add(map_anon(np), np, 1);
		for (size_t pg = 0; pg < np; pg++)
			unit_add(RG[ri].addr + pg * PG, PG, K_MMAP, ri, (uint32_t)pg,
				 (int)rng_below(&rs, (uint64_t)o_threads));
	}
	uint64_t mb = 0;
	size_t nblocks = 0;
	while (mb < malloc_bytes) {
		uint32_t len = malloc_len(&rs);
		unit_add(NULL, len, K_MALLOC, -1, 0, (int)rng_below(&rs, (uint64_t)o_threads));
		mb += len;
		nblocks++;
	}
	if (!o_quiet)
		fprintf(stderr,
			"torture: seed=%" PRIu64 " threads=%d rounds=%d: %d mmap regions (%zu pages), "
			"%d small regions (%zu pages), %zu malloc blocks (%" PRIu64 " KiB)\n",
			o_seed, o_threads, o_rounds, N_BIG, big_pages, N_SMALL, small_pages, nblocks, mb >> 10);

	/* ---- threads ---- */
	WS = xmalloc((size_t)o_threads * sizeof *WS);
	memset(WS, 0, (size_t)o_threads * sizeof *WS);
	if (pthread_barrier_init(&bar_start, NULL, (unsigned)o_threads + 1) ||
	    pthread_barrier_init(&bar_end, NULL, (unsigned)o_threads + 1)) {
		fprintf(stderr, "torture: ERROR pthread_barrier_init\n");
		return 3;
	}
	pthread_t *th = xmalloc((size_t)o_threads * sizeof *th);
	for (int w = 0; w < o_threads; w++)
		if (pthread_create(&th[w], NULL, worker, (void *)(intptr_t)w)) {
			fprintf(stderr, "torture: ERROR pthread_create\n");
			return 3;
		}

	run_phase(PH_INIT, 0);
	if (!o_quiet)
		fprintf(stderr, "torture: init done (%zu units) in %.2fs\n", nU, now_sec() - t0);

	/* ---- rounds ---- */
	for (int r = 0; r < o_rounds; r++) {
		uint64_t before = __atomic_load_n(&g_bad, __ATOMIC_RELAXED);
		run_phase(PH_ROUND, r);
		if (child_pid)
			finish_child();

		uint64_t mrs = rng_for(0x4000 + (uint64_t)r, 3, 4);
		int op = r % 5;
		opdesc[0] = 0;
		switch (op) {
		case 0: op_fork(r, &mrs); break;
		case 1: op_madvise(&mrs); break;
		case 2: op_munmap(&mrs); break;
		case 3: op_mremap(&mrs); break;
		case 4: op_malloc(&mrs); break;
		}
		int full = (r + 1) % FULL_PASS_EVERY == 0 && r != o_rounds - 1;
		if (full) {
			char ctx[48];
			snprintf(ctx, sizeof ctx, "full-pass(round %d)", r);
			verify_all(ctx);
		}
		read_status(&rss_anon, &vmrss, &vmhwm);
		if (rss_anon > peak_anon)
			peak_anon = rss_anon;
		if (!o_quiet)
			fprintf(stderr, "torture: round %d/%d op=%s: %s%s bad=+%" PRIu64 " (%.2fs)\n", r + 1,
				o_rounds, opnames[op], opdesc, full ? " [full pass]" : "",
				__atomic_load_n(&g_bad, __ATOMIC_RELAXED) - before, now_sec() - t0);
	}
	if (child_pid)
		finish_child();

	if (o_inject && o_inject != INJ_CHILD) {
		uint64_t irs = rng_for(0x5000, 5, 6);
		inject(&irs);
	}
	verify_all("final-pass");

	g_phase = PH_QUIT;
	pthread_barrier_wait(&bar_start);
	for (int w = 0; w < o_threads; w++)
		pthread_join(th[w], NULL);
	free(th);

	/* ---- summary ---- */
	uint64_t writes = m_writes, verified = m_verified;
	for (int w = 0; w < o_threads; w++) {
		writes += WS[w].writes;
		verified += WS[w].verified;
	}
	size_t units = 0, pages = 0;
	for (size_t i = 0; i < nU; i++) {
		if (U[i].state == S_DEAD)
			continue;
		units++;
		if (U[i].kind == K_MALLOC)
			pages += (U[i].len + PG - 1) / PG;
	}
	for (size_t i = 0; i < nRG; i++)
		if (RG[i].live)
			pages += RG[i].npages;

	read_status(&rss_anon, &vmrss, &vmhwm);
	if (rss_anon > peak_anon)
		peak_anon = rss_anon;
	if (!o_quiet)
		fprintf(stderr, "torture: elapsed %.2fs\n", now_sec() - t0);
	printf("torture: rss_anon_kib=%ld peak_rss_anon_kib=%ld vmrss_kib=%ld vmhwm_kib=%ld\n", rss_anon,
	       peak_anon, vmrss, vmhwm);
	uint64_t bad = __atomic_load_n(&g_bad, __ATOMIC_RELAXED);
	if (bad) {
		printf("torture: FAILED bad=%" PRIu64 "\n", bad);
		fflush(stdout);
		return 1;
	}
	printf("torture: OK units=%zu pages=%zu rounds=%d forks=%" PRIu64 " writes=%" PRIu64
	       " verified=%" PRIu64 " bad=0\n",
	       units, pages, o_rounds, m_forks, writes, verified);
	fflush(stdout);
	return 0;
}
