/*
 * pagetrace.c - records a C program's page-granular access stream, for replaying it through
 * LRU and Belady's MIN (farmem sim --replace).
 *
 * A userfaultfd pager sees faults only, never the accesses to resident pages, so a fault trace
 * cannot say what LRU or MIN would have done. This file supplies the stream instead: compile the
 * program with gcc's ThreadSanitizer instrumentation, which calls __tsan_read8(addr) and friends
 * before every load and store the compiled code makes (not the ones of an uninstrumented libc),
 * and link this file in place of the sanitizer's runtime:
 *
 *   gcc -O2 -fsanitize=thread --param tsan-instrument-func-entry-exit=0 -c prog.c
 *   gcc -o prog.traced prog.o pagetrace.c
 *   PAGETRACE=prog.pages ./prog.traced ARGS
 *
 * The file written is the page stream format of package faulttrace: the 8 bytes "FMPAGES1",
 * then one little-endian uint64 per access, the page number (address >> 12) with bit 63 set if
 * the access wrote; consecutive accesses to the same page written once, a write among them
 * marking the record (they cannot change what LRU or MIN evicts, nor their misses).
 * At exit one line on stderr: "pagetrace: accesses=N records=R rss_anon_kib=K own_kib=O", where
 * K is the process's anonymous resident memory then (/proc/self/status: RssAnon) and O the part
 * of it that is this recorder's buffer, so that the pages outside the stream (stack, libc's
 * data, anything uninstrumented code touched) can be told: K - O less the stream's pages.
 *
 * Single-threaded programs only: the stream is kept without a lock. A fork child records
 * nothing (its copy of the file is closed at once): the stream is the parent's.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#define BUF_RECORDS (1 << 20) /* 8 MiB of records between writes */

static uint64_t *buf;
static size_t nbuf;
static uint64_t last = UINT64_MAX;
static uint64_t accesses, records;
static int fd = -1;
static int failed;

static void flush(void)
{
	size_t off = 0, len = nbuf * 8;
	while (!failed && off < len) {
		ssize_t n = write(fd, (char *)buf + off, len - off);
		if (n <= 0) {
			perror("pagetrace: write");
			failed = 1;
		} else
			off += n;
	}
	nbuf = 0;
}

#define WROTE (1ULL << 63)

static inline void rec(uint64_t addr, uint64_t size, uint64_t wrote)
{
	accesses++;
	if (fd < 0)
		return;
	for (uint64_t p = addr >> 12, e = (addr + size - 1) >> 12; p <= e; p++) {
		/* A write after reads of the same page marks their record, if not yet flushed (else
		 * it starts a record of its own: a repeat changes no policy's choice). */
		if (p == last && (!wrote || nbuf > 0)) {
			if (wrote)
				buf[nbuf - 1] |= WROTE;
			continue;
		}
		last = p;
		buf[nbuf++] = p | wrote;
		records++;
		if (nbuf == BUF_RECORDS)
			flush();
	}
}

static long rss_anon_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "RssAnon: %ld kB", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

static void child(void)
{
	close(fd);
	fd = -1;
}

static void finish(void)
{
	if (fd < 0)
		return;
	long anon = rss_anon_kib();
	flush();
	if (close(fd) != 0 && !failed) {
		perror("pagetrace: close");
		failed = 1;
	}
	fd = -1;
	fprintf(stderr, "pagetrace: accesses=%llu records=%llu rss_anon_kib=%ld own_kib=%d\n",
		(unsigned long long)accesses, (unsigned long long)records, anon, BUF_RECORDS * 8 / 1024);
	if (failed)
		_exit(3);
}

void __tsan_init(void)
{
	static int done;
	if (done++)
		return;
	const char *path = getenv("PAGETRACE");
	if (!path || !*path)
		return; /* not recording: the program runs as built, a call per access */
	/* Populated at once, so that its pages are counted in own_kib from the start. */
	buf = mmap(NULL, BUF_RECORDS * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (buf == MAP_FAILED) {
		perror("pagetrace: mmap");
		_exit(3);
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "pagetrace: %s: %m\n", path);
		_exit(3);
	}
	if (write(fd, "FMPAGES1", 8) != 8) {
		perror("pagetrace: write");
		_exit(3);
	}
	atexit(finish);
	pthread_atfork(NULL, NULL, child);
}

#define ACCESS(name, size, wrote)                                                            \
	void __tsan_##name##size(void *a) { rec((uintptr_t)a, size, wrote); }                \
	void __tsan_unaligned_##name##size(void *a) { rec((uintptr_t)a, size, wrote); }      \
	void __tsan_volatile_##name##size(void *a) { rec((uintptr_t)a, size, wrote); }
ACCESS(read, 1, 0)
ACCESS(read, 2, 0)
ACCESS(read, 4, 0)
ACCESS(read, 8, 0)
ACCESS(read, 16, 0)
ACCESS(write, 1, WROTE)
ACCESS(write, 2, WROTE)
ACCESS(write, 4, WROTE)
ACCESS(write, 8, WROTE)
ACCESS(write, 16, WROTE)

void __tsan_read_range(void *a, unsigned long size)
{
	if (size)
		rec((uintptr_t)a, size, 0);
}
void __tsan_write_range(void *a, unsigned long size)
{
	if (size)
		rec((uintptr_t)a, size, WROTE);
}
void __tsan_func_entry(void *pc) { (void)pc; }
void __tsan_func_exit(void) {}
