/* zaplag: whether a page the program discards with MADV_DONTNEED is still present once its
 * REMOVE event has been read from the uffd (runtime/register.go, adopt; pagetable/discards.go).
 *
 * A region is written (every page present), then registered (MISSING, EVENT_REMOVE). A thread
 * discards its pages one at a time; this thread reads each REMOVE event and, at once, reads the
 * page's pagemap entry. The kernel queues the event and waits until it is read, and only then
 * zaps: a page found present after the read is one whose zap was still to come, which is what a
 * pagemap reader (adopt) can meet. It also reports the longest time from the read to the
 * madvise's return, seen by the discarding thread.
 *
 *   cc -O2 -o zaplag probes/zaplag.c -lpthread && ./zaplag [pages]   # as root (pagemap PFNs)
 *
 * Rows and what they show: results/zaplag.md. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PS 4096UL

static char *region;
static long pages;
static atomic_long returned = -1; /* the last page whose madvise returned */

static double now_us(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int present(int pm, char *p) {
	uint64_t e;
	if (pread(pm, &e, 8, (uintptr_t)p / PS * 8) != 8) {
		perror("pagemap");
		exit(2);
	}
	return (e >> 63) & 1;
}

static void *discarder(void *arg) {
	(void)arg;
	for (long i = 0; i < pages; i++) {
		if (madvise(region + i * PS, PS, MADV_DONTNEED)) {
			perror("madvise");
			exit(2);
		}
		atomic_store(&returned, i);
	}
	return NULL;
}

int main(int argc, char **argv) {
	pages = argc > 1 ? atol(argv[1]) : 20000;
	region = mmap(NULL, pages * PS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (long i = 0; i < pages; i++)
		region[i * PS] = 1;
	int fd = syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd < 0) {
		perror("userfaultfd");
		return 2;
	}
	struct uffdio_api api = {.api = UFFD_API, .features = UFFD_FEATURE_EVENT_REMOVE};
	struct uffdio_register reg = {.range = {(uintptr_t)region, pages * PS}, .mode = UFFDIO_REGISTER_MODE_MISSING};
	if (ioctl(fd, UFFDIO_API, &api) || ioctl(fd, UFFDIO_REGISTER, &reg)) {
		perror("uffd");
		return 2;
	}
	int pm = open("/proc/self/pagemap", O_RDONLY);
	pthread_t t;
	pthread_create(&t, NULL, discarder, NULL);
	long after_read = 0, after_return = 0;
	double worst = 0;
	for (long i = 0; i < pages; i++) {
		struct uffd_msg m;
		if (read(fd, &m, sizeof m) != sizeof m || m.event != UFFD_EVENT_REMOVE) {
			fprintf(stderr, "read: unexpected\n");
			return 2;
		}
		char *p = (char *)(uintptr_t)m.arg.remove.start;
		double t0 = now_us();
		after_read += present(pm, p);
		long at = (p - region) / PS;
		while (atomic_load(&returned) < at)
			;
		double d = now_us() - t0;
		if (d > worst)
			worst = d;
		after_return += present(pm, p);
	}
	pthread_join(t, NULL);
	printf("zaplag: %ld pages discarded; present just after the REMOVE was read: %ld (%.1f %%); "
	       "present after madvise returned: %ld; longest read-to-return %.0f us\n",
	       pages, after_read, 100.0 * after_read / pages, after_return, worst);
	return after_return != 0;
}
