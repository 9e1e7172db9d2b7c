/* stagingdrop: what the drop of an eviction batch's staging area costs, two ways. The staging
 * area is registered on the program's uffd (MISSING|WP), whose reader must read the REMOVE event
 * that a madvise(MADV_DONTNEED) there raises before the madvise goes on (runtime reader: another
 * thread here, pinned to a CPU, as farmem's fault thread is another process's).
 *
 *   registered    madvise(DONTNEED) of the registered area: one REMOVE round trip
 *   unregistered  UFFDIO_UNREGISTER, madvise(DONTNEED), UFFDIO_REGISTER again: no event
 *
 * Each round fills each area's 256 pages without a fault (UFFDIO_COPY; a batch's moves fill it
 * with UFFDIO_MOVE) and then times its drop alone, the two ways interleaved.
 *
 *   cc -O2 -pthread -o stagingdrop probes/stagingdrop.c && for h in 0 1; do ./stagingdrop $h; done
 *
 * argv[1]: the reader's CPU (the dropping thread is on CPU 0). Prints the median and the 90th
 * percentile of each way, in microseconds a drop, over interleaved rounds. */
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <pthread.h>
#include <sched.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#define PAGES 256
#define ROUNDS 400
static int uffd;
static volatile long removes;

static void pin(int c)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(c, &s);
	sched_setaffinity(0, sizeof s, &s);
}

static void *reader(void *a)
{
	pin((long)a);
	struct uffd_msg m[64];
	for (;;) {
		struct pollfd p = { uffd, POLLIN };
		poll(&p, 1, -1);
		long n = read(uffd, m, sizeof m);
		if (n > 0) removes += n / sizeof m[0];
	}
	return 0;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* area maps PAGES pages between two PROT_NONE guards, as the agent's staging area is. */
static char *area(void)
{
	char *g = mmap(0, (PAGES + 2) * 4096L, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return mmap(g + 4096, PAGES * 4096L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

static int reg(char *a)
{
	struct uffdio_register r = { .range = { (unsigned long)a, PAGES * 4096L },
				     .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	return ioctl(uffd, UFFDIO_REGISTER, &r);
}

int main(int argc, char **argv)
{
	int rcpu = argc > 1 ? atoi(argv[1]) : 1;
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		perror("userfaultfd");
		return 1;
	}
	char *a[2] = { area(), area() };
	if (reg(a[0]) || reg(a[1])) {
		perror("register");
		return 1;
	}
	pthread_t h;
	pthread_create(&h, 0, reader, (void *)(long)rcpu);
	pin(0);
	usleep(10000);
	static double t[2][ROUNDS];
	static char src[PAGES * 4096] __attribute__((aligned(4096)));
	long before = removes;
	for (int r = 0; r < ROUNDS; r++) {
		for (int w = 0; w < 2; w++) {
			/* An absent registered page would fault to the reader, which serves nothing. */
			memset(src, r + 1, sizeof src);
			struct uffdio_copy c = { .dst = (unsigned long)a[w], .src = (unsigned long)src, .len = sizeof src };
			if (ioctl(uffd, UFFDIO_COPY, &c)) { perror("copy"); return 1; }
			double t0 = now();
			if (w == 1) {
				struct uffdio_range u = { (unsigned long)a[1], PAGES * 4096L };
				if (ioctl(uffd, UFFDIO_UNREGISTER, &u)) { perror("unregister"); return 1; }
			}
			if (madvise(a[w], PAGES * 4096L, MADV_DONTNEED)) { perror("madvise"); return 1; }
			if (w == 1 && reg(a[1])) { perror("register again"); return 1; }
			t[w][r] = now() - t0;
		}
	}
	const char *name[2] = { "registered", "unregistered" };
	printf("reader on CPU %d, dropper on CPU 0, %d pages a drop, %d rounds; REMOVE events read: %ld (want %d)\n",
	       rcpu, PAGES, ROUNDS, removes - before, ROUNDS);
	for (int w = 0; w < 2; w++) {
		qsort(t[w], ROUNDS, sizeof t[w][0], cmp);
		printf("%-13s median %7.1f us  p90 %7.1f us\n", name[w], t[w][ROUNDS / 2], t[w][ROUNDS * 9 / 10]);
	}
	return 0;
}
