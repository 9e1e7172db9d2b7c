/* storefile: what it costs to keep evicted pages in a memfd written through a mapping, as the
 * embedded store's spaces do (backend/arena.go), against writing and reading the file with
 * pwrite and pread, which touch no page of the process's own: the kernel copies through its
 * own map of memory. On a PVM guest the first touch of a page from user space is hypervisor
 * work however the page came in (results/prefault.md); a copy by the kernel may not be.
 *
 * Per round, a fresh memfd of the same size for each way, every page written once from a
 * 4 KiB buffer, as a store fills new slots, then read back into a buffer, as a fault loads a
 * slot, then freed (a hole punched over the whole file, as the store's trim does) and written
 * again, as a store reuses trimmed slots:
 *   map_fill    the mapping filled in 64 pages at a time (MADV_POPULATE_WRITE) and written
 *               with memcpy: the store today (per page)
 *   map_read    each page read back with memcpy from the mapping
 *   map_again   MADV_REMOVE of the whole mapping, then map_fill's writes again
 *   pw_fill     pwrite of each page at its offset
 *   pw_fill64   pwritev of 64 pages at a time
 *   pr_read     pread of each page
 *   pw_again    FALLOC_FL_PUNCH_HOLE of the whole file, then pwrite of each page again
 *   pw_rewrite  pwrite of each page over itself (no allocation): the copy and the call alone
 *   mapped_pw   the pages pwrite wrote, read through a fresh mapping of the file: what mixing
 *               the two ways would cost a reader that maps
 *
 *   cc -O2 -o storefile probes/storefile.c && ./storefile [pages] [rounds]
 *
 * Rows and what they show: results/storefile.md. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define PS 4096UL

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
  perror(what);
  exit(1);
}

static int memfd(size_t n) {
  int fd = memfd_create("storefile", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, n * PS) != 0)
    die("memfd");
  return fd;
}

static char *mapfile(int fd, size_t n) {
  char *p = mmap(NULL, n * PS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED)
    die("mmap");
  return p;
}

static void map_writes(char *p, size_t n, const char *src) {
  for (size_t i = 0; i < n; i += 64) {
    size_t k = n - i < 64 ? n - i : 64;
    madvise(p + i * PS, k * PS, MADV_POPULATE_WRITE);
    for (size_t j = i; j < i + k; j++)
      memcpy(p + j * PS, src, PS);
  }
}

static void map_reads(const char *p, size_t n, char *dst) {
  for (size_t i = 0; i < n; i++)
    memcpy(dst, p + i * PS, PS);
}

static void pwrites(int fd, size_t n, const char *src) {
  for (size_t i = 0; i < n; i++)
    if (pwrite(fd, src, PS, i * PS) != (ssize_t)PS)
      die("pwrite");
}

static void pwritevs(int fd, size_t n, char *src) {
  struct iovec iov[64];
  for (size_t i = 0; i < n; i += 64) {
    size_t k = n - i < 64 ? n - i : 64;
    for (size_t j = 0; j < k; j++)
      iov[j] = (struct iovec){src + j * PS, PS};
    if (pwritev(fd, iov, k, i * PS) != (ssize_t)(k * PS))
      die("pwritev");
  }
}

static void preads(int fd, size_t n, char *dst) {
  for (size_t i = 0; i < n; i++)
    if (pread(fd, dst, PS, i * PS) != (ssize_t)PS)
      die("pread");
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 16384;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  static char src[64 * PS], dst[PS];
  memset(src, 0x5a, sizeof src);
  printf("round pages map_fill map_read map_again pw_fill pw_fill64 pr_read pw_again pw_rewrite mapped_pw\n");
  for (int r = 1; r <= rounds; r++) {
    double t[12];
    int a = memfd(n), b = memfd(n), c = memfd(n);
    char *pa = mapfile(a, n);
    t[0] = now();
    map_writes(pa, n, src);
    t[1] = now();
    map_reads(pa, n, dst);
    t[2] = now();
    if (madvise(pa, n * PS, MADV_REMOVE) != 0)
      die("madvise(MADV_REMOVE)");
    map_writes(pa, n, src);
    t[3] = now();
    pwrites(b, n, src);
    t[4] = now();
    pwritevs(c, n, src);
    t[5] = now();
    preads(b, n, dst);
    t[6] = now();
    if (fallocate(b, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, n * PS) != 0)
      die("fallocate");
    pwrites(b, n, src);
    t[7] = now();
    pwrites(b, n, src);
    t[8] = now();
    char *pc = mapfile(c, n);
    map_reads(pc, n, dst);
    t[9] = now();
    printf("%d %zu", r, n);
    for (int i = 1; i <= 9; i++)
      printf(" %.2f", (t[i] - t[i - 1]) / n * 1e6);
    printf("\n");
    munmap(pa, n * PS);
    munmap(pc, n * PS);
    close(a);
    close(b);
    close(c);
  }
  return 0;
}
