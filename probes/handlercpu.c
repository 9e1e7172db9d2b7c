/* handlercpu: what one missing-page fault costs the faulting thread, by where its userfaultfd
 * handler runs: a thread of the faulting process or another process (farmem's way), on the
 * faulting thread's CPU or on the other one, the latter either sleeping in read until a fault
 * comes or polling the uffd without sleeping (a CPU given to the handler); and, beside them,
 * the kernel's own anonymous fault on the same pattern (a page discarded with MADV_DONTNEED,
 * then written).
 *
 * The faulting thread is pinned to CPU 0 and writes one byte to each page of a registered
 * region in order; the handler answers each fault with one UFFDIO_COPY of a 4 KiB page. The
 * modes run interleaved, round after round, so a host whose speed drifts drifts for all.
 *
 *   cc -O2 -o handlercpu probes/handlercpu.c -lpthread && ./handlercpu [pages] [rounds]
 *
 * Rows and what they show: results/machine.md. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
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

static int uffd, handler_cpu, poll_uffd;
static char *src;

static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  if (sched_setaffinity(0, sizeof s, &s) != 0) {
    perror("sched_setaffinity");
    exit(1);
  }
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void serve(void) {
  pin(handler_cpu);
  if (poll_uffd) /* read returns EAGAIN at once: the loop below never sleeps */
    fcntl(uffd, F_SETFL, fcntl(uffd, F_GETFL) | O_NONBLOCK);
  struct uffd_msg m;
  for (;;) {
    ssize_t n = read(uffd, &m, sizeof m);
    if (n != sizeof m) {
      if (n < 0)
        continue;
      break;
    }
    if (m.event != UFFD_EVENT_PAGEFAULT)
      continue;
    struct uffdio_copy c = {.dst = m.arg.pagefault.address & ~(PS - 1), .src = (uint64_t)src, .len = PS};
    if (ioctl(uffd, UFFDIO_COPY, &c) < 0)
      perror("UFFDIO_COPY");
  }
}

static void *thread_main(void *a) {
  (void)a;
  serve();
  return NULL;
}

/* faults returns the microseconds per page of writing one byte to each of pages pages of r. */
static double faults(char *r, size_t pages) {
  double t0 = now();
  for (size_t i = 0; i < pages; i++)
    r[i * PS + 8] = 3;
  return (now() - t0) * 1e6 / pages;
}

/* uffd_round: one round with the handler as a thread (proc 0) or a process, on cpu, polling
 * the uffd (polls 1) or sleeping in read. */
static double uffd_round(size_t pages, int proc, int cpu, int polls) {
  size_t len = pages * PS;
  char *r = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (size_t i = 0; i < len; i += PS)
    r[i] = 1; /* guest memory behind the pages warm, as in a program that ran a while */
  madvise(r, len, MADV_DONTNEED);
  uffd = syscall(SYS_userfaultfd, O_CLOEXEC);
  struct uffdio_api api = {.api = UFFD_API};
  struct uffdio_register reg = {.range = {(uint64_t)r, len}, .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api) || ioctl(uffd, UFFDIO_REGISTER, &reg)) {
    perror("userfaultfd");
    exit(1);
  }
  handler_cpu = cpu;
  poll_uffd = polls;
  pid_t child = 0;
  pthread_t t;
  if (proc) {
    if ((child = fork()) == 0) {
      serve();
      _exit(0);
    }
  } else {
    pthread_create(&t, NULL, thread_main, NULL);
  }
  usleep(100000);
  double us = faults(r, pages);
  if (child) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  } else {
    pthread_cancel(t); /* read, where it waits or polls, is a cancellation point */
    pthread_join(t, NULL);
  }
  close(uffd);
  munmap(r, len);
  return us;
}

int main(int argc, char **argv) {
  size_t pages = argc > 1 ? strtoul(argv[1], NULL, 0) : 65536;
  int rounds = argc > 2 ? atoi(argv[2]) : 3;
  src = aligned_alloc(PS, PS);
  memset(src, 7, PS);
  pin(0);
  printf("round pages kernel_us thread_same_cpu_us process_same_cpu_us thread_other_cpu_us process_other_cpu_us thread_other_cpu_polling_us process_other_cpu_polling_us\n");
  for (int k = 1; k <= rounds; k++) {
    char *r = mmap(NULL, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    faults(r, pages);
    madvise(r, pages * PS, MADV_DONTNEED);
    double kernel = faults(r, pages);
    munmap(r, pages * PS);
    double ts = uffd_round(pages, 0, 0, 0), ps = uffd_round(pages, 1, 0, 0);
    double to = uffd_round(pages, 0, 1, 0), po = uffd_round(pages, 1, 1, 0);
    double top = uffd_round(pages, 0, 1, 1), pop = uffd_round(pages, 1, 1, 1);
    printf("%d %zu %.2f %.2f %.2f %.2f %.2f %.2f %.2f\n", k, pages, kernel, ts, ps, to, po, top, pop);
    fflush(stdout);
  }
  return 0;
}
