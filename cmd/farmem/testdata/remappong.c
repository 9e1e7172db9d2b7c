/* remappong: moves a buffer of MIB MiB back and forth with mremap while its pages are evicted, as
 * glibc's realloc moves a growing buffer: ROUNDS times, from one place to the other and back to a
 * place a few pages off the first, so that an address the buffer had before holds another of
 * its pages after. Every 16th round it reads (and rewrites, the same) every page of the buffer,
 * each checked, which brings them back and makes them the next victims. A second thread reads
 * and rewrites the pages of a second buffer of MIB MiB at random meanwhile, each checked: the
 * faults that keep the eviction going while the first buffer moves.
 * usage: remappong MIB ROUNDS; prints "ok ROUNDS", or the first page found wrong and exits 1. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PAGE 4096UL
#define SHIFT 8 /* pages: the most the buffer lands off its first place */

static uint64_t tag(size_t page, int buf) { return page * 0x9e3779b97f4a7c15ULL + 7 + buf; }

static void fill(uint64_t *b, size_t pages, int buf)
{
	for (size_t i = 0; i < pages; i++) {
		b[i * (PAGE / 8)] = tag(i, buf);
		b[i * (PAGE / 8) + PAGE / 8 - 1] = ~tag(i, buf);
	}
}

/* check checks page i of buffer buf, at b, and rewrites its first word (the same: the page is
 * dirty again). */
static int check(uint64_t *b, size_t i, int buf, long round)
{
	uint64_t *p = b + i * (PAGE / 8);
	if (p[0] == tag(i, buf) && p[PAGE / 8 - 1] == ~tag(i, buf)) {
		p[0] = tag(i, buf);
		return 0;
	}
	printf("buffer %d, round %ld: page %zu reads %#lx/%#lx, not %#lx/%#lx\n", buf, round, i, (unsigned long)p[0],
	       (unsigned long)p[PAGE / 8 - 1], (unsigned long)tag(i, buf), (unsigned long)~tag(i, buf));
	fflush(stdout);
	return 1;
}

static size_t pages;
static uint64_t *other_buf;
static volatile int done;

static void *toucher(void *arg)
{
	(void)arg;
	unsigned seed = 2;
	for (long n = 0; !done; n++)
		if (check(other_buf, (size_t)rand_r(&seed) % pages, 1, n)) exit(1);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: remappong MIB ROUNDS\n");
		return 2;
	}
	size_t size = strtoul(argv[1], 0, 10) << 20;
	pages = size / PAGE;
	long rounds = strtol(argv[2], 0, 10);
	/* A reservation for both places: the first at r (and up to SHIFT pages above), the other
	 * SHIFT pages past the first's end, so that the two never overlap. */
	size_t span = 2 * size + 2 * SHIFT * PAGE;
	char *r = mmap(0, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	other_buf = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r == MAP_FAILED || other_buf == MAP_FAILED) return 2;
	char *there = r + size + 2 * SHIFT * PAGE;
	uint64_t *b = mmap(r, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (b == MAP_FAILED) return 2;
	fill(b, pages, 0);
	fill(other_buf, pages, 1);
	pthread_t t;
	if (pthread_create(&t, 0, toucher, 0)) return 2;
	srand(1);
	for (long round = 0; round < rounds; round++) {
		char *to = (char *)b == there ? r + (size_t)(rand() % (SHIFT + 1)) * PAGE : there;
		uint64_t *nb = mremap(b, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, to);
		if (nb == MAP_FAILED) {
			perror("mremap");
			return 2;
		}
		b = nb;
		if (round % 64 == 63)
			for (size_t i = 0; i < pages; i++)
				if (check(b, i, 0, round)) return 1;
	}
	done = 1;
	pthread_join(t, 0);
	for (size_t i = 0; i < pages; i++)
		if (check(b, i, 0, rounds) || check(other_buf, i, 1, rounds)) return 1;
	printf("ok %ld\n", rounds);
	return 0;
}
