/* prefault: what the first write to each page of a fresh anonymous mapping costs, written one
 * page at a time as the embedded store fills its slots (backend/arena.go), against having the
 * kernel fill the pages in first with one MADV_POPULATE_WRITE over the range (fillAhead).
 *
 * Per round, four fresh mappings of the same size, each written page by page with memcpy of
 * 4 KiB, as a store writes an evicted page into a new slot:
 *   demand     the writes alone: each first write faults its page in
 *   populate   one MADV_POPULATE_WRITE of the whole range, per page ...
 *   after      ... and then the writes
 *   rewrite    the writes again, to pages present and written before: the copy alone
 *   chunked    MADV_POPULATE_WRITE of 64 pages at a time, each followed by its writes, as
 *              the store does it (the two together, per page)
 *
 *   cc -O2 -o prefault probes/prefault.c && ./prefault [pages] [rounds]
 *
 * Rows and what they show: results/prefault.md. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PS 4096UL

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static char *fresh(size_t n) {
  char *p = mmap(NULL, n * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  return p;
}

static void writes(char *p, size_t n, const char *src) {
  for (size_t i = 0; i < n; i++)
    memcpy(p + i * PS, src, PS);
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 16384;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  static char src[PS];
  memset(src, 0x5a, sizeof src);
  printf("round pages demand_us populate_us after_us rewrite_us chunked_us\n");
  for (int r = 1; r <= rounds; r++) {
    char *a = fresh(n), *b = fresh(n), *c = fresh(n);
    double t0 = now();
    writes(a, n, src);
    double t1 = now();
    if (madvise(b, n * PS, MADV_POPULATE_WRITE) != 0) {
      perror("madvise(MADV_POPULATE_WRITE)");
      return 1;
    }
    double t2 = now();
    writes(b, n, src);
    double t3 = now();
    writes(b, n, src);
    double t4 = now();
    for (size_t i = 0; i < n; i += 64) {
      size_t k = n - i < 64 ? n - i : 64;
      madvise(c + i * PS, k * PS, MADV_POPULATE_WRITE);
      writes(c + i * PS, k, src);
    }
    double t5 = now();
    printf("%d %zu %.2f %.2f %.2f %.2f %.2f\n", r, n, (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6,
           (t3 - t2) / n * 1e6, (t4 - t3) / n * 1e6, (t5 - t4) / n * 1e6);
    munmap(a, n * PS);
    munmap(b, n * PS);
    munmap(c, n * PS);
  }
  return 0;
}
