/* relay: is the cost of a fault served from another process the switches between processes, or
 * the install made from another address space than the faulting thread's? Modes, all pinned to
 * CPU 0, one fault per page written, each answered with one UFFDIO_COPY of a 4 KiB page:
 *   thread:  a thread of the faulting process reads the uffd and installs (UFFDIO_COPY);
 *   process: another process reads and installs;
 *   relay:   another process reads, and a thread of the faulting process installs, woken by a
 *            futex in shared memory (the same number of switches between processes as
 *            'process', one more switch between threads).
 *
 *   cc -O2 -o relay probes/relay.c -lpthread && ./relay [pages] [rounds]
 *
 * Rows and what they show: results/machine.md. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/futex.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define PS 4096UL
static int uffd;
static char *src;
struct shared { _Atomic uint32_t seq, done; uint64_t addr; int stop; };
static struct shared *sh;
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); sched_setaffinity(0, sizeof s, &s); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static long futex(_Atomic uint32_t *a, int op, uint32_t v) { return syscall(SYS_futex, a, op, v, NULL, NULL, 0); }
static void install(uint64_t a) {
  struct uffdio_copy c = {.dst = a & ~(PS - 1), .src = (uint64_t)src, .len = PS};
  if (ioctl(uffd, UFFDIO_COPY, &c) < 0) perror("UFFDIO_COPY");
}
static void serve(int relay) {
  struct uffd_msg m;
  for (;;) {
    if (read(uffd, &m, sizeof m) != sizeof m) continue;
    if (m.event != UFFD_EVENT_PAGEFAULT) continue;
    if (!relay) { install(m.arg.pagefault.address); continue; }
    sh->addr = m.arg.pagefault.address;
    atomic_fetch_add(&sh->seq, 1);
    futex(&sh->seq, FUTEX_WAKE, 1);
  }
}
static void *thread_main(void *a) { serve(0); return a; }
static void *installer(void *a) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t s = atomic_load(&sh->seq);
    if (sh->stop) return a;
    if (s == seen) { futex(&sh->seq, FUTEX_WAIT, s); continue; }
    seen = s;
    install(sh->addr);
  }
}
static double faults(char *r, size_t pages) {
  double t0 = now();
  for (size_t i = 0; i < pages; i++) r[i * PS + 8] = 3;
  return (now() - t0) * 1e6 / pages;
}
static double round_(size_t pages, int mode) {
  size_t len = pages * PS;
  char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (size_t i = 0; i < len; i += PS) r[i] = 1;
  madvise(r, len, MADV_DONTNEED);
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
  struct uffdio_api api = {.api = UFFD_API};
  struct uffdio_register reg = {.range = {(uint64_t)r, len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &reg)) { perror("uffd"); exit(1); }
  memset(sh, 0, sizeof *sh);
  pid_t child = 0; pthread_t t, it;
  if (mode == 0) pthread_create(&t, NULL, thread_main, NULL);
  else if ((child = fork()) == 0) { serve(mode == 2); _exit(0); }
  if (mode == 2) pthread_create(&it, NULL, installer, NULL);
  usleep(100000);
  double us = faults(r, pages);
  if (child) { kill(child, SIGKILL); waitpid(child, NULL, 0); }
  else { pthread_cancel(t); pthread_join(t, NULL); }
  if (mode == 2) { sh->stop = 1; atomic_fetch_add(&sh->seq, 1); futex(&sh->seq, FUTEX_WAKE, 1); pthread_join(it, NULL); }
  close(uffd); munmap(r, len);
  return us;
}
int main(int argc, char **argv) {
  size_t pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  src = aligned_alloc(PS, PS); memset(src, 7, PS);
  sh = mmap(NULL, PS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  pin(0);
  printf("round pages thread_us process_us relay_us\n");
  for (int k = 1; k <= rounds; k++) {
    double a = round_(pages, 0), b = round_(pages, 1), c = round_(pages, 2);
    printf("%d %zu %.2f %.2f %.2f\n", k, pages, a, b, c);
    fflush(stdout);
  }
}
