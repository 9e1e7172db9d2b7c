/* computing: a program whose threads compute between their page touches, the case where holding
 * them on one CPU (runtime/gather.go) would cost more than it saves. THREADS threads share a
 * buffer of MIB MiB; each, ITERS times, runs SPIN rounds of arithmetic and then writes one byte of
 * a random page. Every byte is written with the value it was filled with ((page + offset) & 255),
 * so the whole buffer is checked at the end, after however much paging: any other byte is
 * reported and fails the run.
 * usage: computing THREADS MIB ITERS SPIN
 * prints: "computing: N threads, S s, OK" or "computing: ... BAD K bytes" (exit 1). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static unsigned char *buf;
static size_t pages;
static long iters, spin;

static unsigned char want(size_t page, size_t off) { return (unsigned char)(page + off); }

static void *work(void *arg)
{
	uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ULL + 1, acc = 0;
	for (long i = 0; i < iters; i++) {
		for (long k = 0; k < spin; k++) acc += (acc ^ (uint64_t)k) * 31;
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t p = x % pages, off = (size_t)(i + (long)acc) & 4095;
		buf[p * 4096 + off] = want(p, off);
	}
	return (void *)(uintptr_t)acc;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: computing THREADS MIB ITERS SPIN\n");
		return 2;
	}
	int n = atoi(argv[1]);
	size_t mib = strtoul(argv[2], 0, 10);
	iters = atol(argv[3]), spin = atol(argv[4]);
	if (n < 1 || n > 64 || mib < 1) {
		fprintf(stderr, "computing: 1 to 64 threads, at least 1 MiB\n");
		return 2;
	}
	pages = mib << 8;
	buf = mmap(0, mib << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) return 2;
	for (size_t p = 0; p < pages; p++)
		for (size_t off = 0; off < 4096; off++) buf[p * 4096 + off] = want(p, off);
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	pthread_t t[64];
	for (int i = 0; i < n; i++) pthread_create(&t[i], 0, work, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < n; i++) pthread_join(t[i], 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	size_t bad = 0;
	for (size_t p = 0; p < pages; p++)
		for (size_t off = 0; off < 4096; off++) bad += buf[p * 4096 + off] != want(p, off);
	double s = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
	if (bad) {
		printf("computing: %d threads, %.2f s, BAD %zu bytes\n", n, s, bad);
		return 1;
	}
	printf("computing: %d threads, %.2f s, OK\n", n, s);
	return 0;
}
