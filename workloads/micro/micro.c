/*
 * micro.c - page-access micro-benchmark for farmem: touches a footprint in a chosen page order,
 * verifies every page it reads, and prints the access rate.
 *
 *   micro [--mib N] [--pattern seq|random|stride:K|strides:K1,K2|zipf[:THETA]] [--passes P] [--seed S]
 *
 * Patterns: seq walks the pages in order; random visits a fresh permutation each pass; stride:K
 * walks every K-th page, then again from the next offset (0, K, 2K, ..., 1, K+1, ...), so every
 * page is visited once a pass; strides:K1,K2 is two interleaved streams: the first half of the
 * footprint walked as stride:K1 and the second half as stride:K2, alternating one access from
 * each (the longer stream finishes alone); zipf:THETA makes each pass N accesses drawn from YCSB's
 * zipfian distribution (constant THETA in (0, 1), 0.99 by default) over page popularity ranks,
 * the ranks spread over the pages by a permutation drawn once, so the same pages stay hot from
 * pass to pass and some are not visited at all.
 *
 * The footprint is filled once (each page holds its own index and pass number in every 8-byte
 * word), then P passes read-modify-write one word per page in the pattern's order and check the
 * whole page. Output, one line per phase: "micro: PHASE pages=N secs=S pages_per_sec=R", and
 * "micro: OK bad=0" (exit 0) or "micro: BAD ..." (exit 1) at the end.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/mman.h>
#include <time.h>

#define PG 4096UL
#define WORDS (PG / 8)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rng = 88172645463325252ULL;
static uint64_t xorshift(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return rng;
}

static void usage(void)
{
	fprintf(stderr, "usage: micro [--mib N] [--pattern seq|random|stride:K|strides:K1,K2|zipf[:THETA]] [--passes P] [--seed S]\n"
			"  seq: pages in order; random: a new permutation each pass; stride:K: every K-th page,\n"
			"  then the next offset; strides:K1,K2: the first half as stride:K1 and the second as\n"
			"  stride:K2, one access from each in turn; zipf:THETA: N accesses a pass drawn from a\n"
			"  zipfian (YCSB's, THETA in (0, 1), default 0.99) over pages ranked by a fixed permutation\n");
	exit(2);
}

int main(int argc, char **argv)
{
	size_t mib = 256, passes = 2, stride = 1, stride2 = 0; /* stride2 > 0: strides:stride,stride2 */
	int random = 0;
	setvbuf(stdout, NULL, _IOLBF, 0); /* each phase line as it ends, for whoever watches the run */
	double theta = 0; /* > 0: zipf:theta */
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--mib") && v) mib = strtoul(v, NULL, 0), i++;
		else if (!strcmp(argv[i], "--passes") && v) passes = strtoul(v, NULL, 0), i++;
		else if (!strcmp(argv[i], "--seed") && v) rng = strtoull(v, NULL, 0) | 1, i++;
		else if (!strcmp(argv[i], "--pattern") && v) {
			if (!strcmp(v, "seq")) stride = 1;
			else if (!strcmp(v, "random")) random = 1;
			else if (!strcmp(v, "zipf")) theta = 0.99;
			else if (!strncmp(v, "zipf:", 5)) {
				char *end;
				theta = strtod(v + 5, &end);
				if (*end || !(theta > 0 && theta < 1)) usage();
			}
			else if (!strncmp(v, "stride:", 7) && atoi(v + 7) > 0) stride = atoi(v + 7);
			else if (!strncmp(v, "strides:", 8)) {
				char *end;
				long a = strtol(v + 8, &end, 10), b = *end == ',' ? strtol(end + 1, &end, 10) : 0;
				if (a <= 0 || b <= 0 || *end) usage();
				stride = a, stride2 = b;
			} else usage();
			i++;
		} else usage();
	}
	size_t n = mib << 20 >> 12;
	if (n == 0) usage();
	uint64_t *m = mmap(NULL, n * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) { perror("mmap"); return 3; }
	uint32_t *order = malloc(n * sizeof *order);
	uint8_t *gen = calloc(n, 1);
	if (!order || !gen) { perror("malloc"); return 3; }

	double t0 = now();
	for (size_t p = 0; p < n; p++)
		for (size_t w = 0; w < WORDS; w++) m[p * WORDS + w] = p << 8 | w << 32;
	double t1 = now();
	printf("micro: fill pages=%zu secs=%.3f pages_per_sec=%.0f\n", n, t1 - t0, n / (t1 - t0));

	/* The visiting order: a stride walk covering every page, two of them interleaved over the
	 * two halves, or a random permutation (shuffled each pass). */
	size_t k = 0;
	if (stride2) {
		size_t h = n / 2, a_s = 0, a_p = 0, b_s = 0, b_p = h, a_done = h == 0, b_done = 0;
		while (!a_done || !b_done) {
			if (!a_done) {
				order[k++] = a_p;
				if ((a_p += stride) >= h && (a_p = ++a_s) >= stride) a_done = 1;
				else if (a_p >= h) a_done = 1; /* stride wider than the half: offsets past it */
			}
			if (!b_done) {
				order[k++] = b_p;
				if ((b_p += stride2) >= n && (b_p = h + ++b_s) >= h + stride2) b_done = 1;
				else if (b_p >= n) b_done = 1;
			}
		}
	} else
		for (size_t s = 0; s < stride; s++)
			for (size_t p = s; p < n; p += stride) order[k++] = p;
	if (k != n) { fprintf(stderr, "micro: the order has %zu pages, want %zu\n", k, n); return 3; }
	/* zipf: rank -> page, a seeded shuffle of the identity order just built (kept for the run),
	 * and YCSB's generator constants (Gray et al.), as workloads/bench/redisdrive has them. */
	uint32_t *rank2page = NULL;
	double zetan = 0, alpha = 0, eta = 0, half = 0;
	if (theta > 0) {
		rank2page = malloc(n * sizeof *rank2page);
		if (!rank2page) { perror("malloc"); return 3; }
		memcpy(rank2page, order, n * sizeof *order);
		for (size_t i = n - 1; i > 0; i--) {
			size_t j = xorshift() % (i + 1);
			uint32_t t = rank2page[i]; rank2page[i] = rank2page[j]; rank2page[j] = t;
		}
		for (size_t i = 1; i <= n; i++) zetan += 1 / pow((double)i, theta);
		alpha = 1 / (1 - theta);
		half = 1 + pow(0.5, theta);
		eta = (1 - pow(2.0 / n, 1 - theta)) / (1 - half / zetan);
	}
	for (size_t i = 0; i < n; i++) gen[order[i]]++; /* a permutation: every page once a pass */
	for (size_t p = 0; p < n; p++)
		if (gen[p] != 1) { fprintf(stderr, "micro: the order visits page %zu %u times\n", p, gen[p]); return 3; }
	memset(gen, 0, n);
	size_t bad = 0;
	for (size_t pass = 1; pass <= passes; pass++) {
		if (random)
			for (size_t i = n - 1; i > 0; i--) {
				size_t j = xorshift() % (i + 1);
				uint32_t t = order[i]; order[i] = order[j]; order[j] = t;
			}
		/* zipf: pages repeat within a pass; the check below holds, since a page's expected
		 * pass number (gen) is updated at each visit. */
		if (theta > 0)
			for (size_t i = 0; i < n; i++) {
				double u = (xorshift() >> 11) * 0x1.0p-53, uz = u * zetan;
				size_t r = uz < 1 ? 0 : uz < half ? 1 : (size_t)(n * pow(eta * u - eta + 1, alpha));
				order[i] = rank2page[r < n ? r : n - 1];
			}
		t0 = now();
		for (size_t i = 0; i < n; i++) {
			size_t p = order[i];
			uint64_t *pg = m + p * WORDS;
			for (size_t w = 0; w < WORDS; w++)
				if (pg[w] != (p << 8 | w << 32 | gen[p])) {
					if (bad++ < 10) fprintf(stderr, "micro: page %zu word %zu = %#lx, want %#lx\n", p, w,
								 (unsigned long)pg[w], (unsigned long)(p << 8 | w << 32 | gen[p]));
					break;
				}
			gen[p] = (uint8_t)pass;
			pg[xorshift() % WORDS] = 0; /* dirty it, then rewrite the page's expected content */
			for (size_t w = 0; w < WORDS; w++) pg[w] = p << 8 | w << 32 | gen[p];
		}
		t1 = now();
		printf("micro: pass%zu pages=%zu secs=%.3f pages_per_sec=%.0f\n", pass, n, t1 - t0, n / (t1 - t0));
	}
	if (bad) { printf("micro: BAD bad=%zu\n", bad); return 1; }
	printf("micro: OK bad=0\n");
	return 0;
}
