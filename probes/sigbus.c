// sigbus: what a missing-page fault costs when the faulting thread serves it itself.
//
// farmem serves every fault from a handler thread: the faulting thread sleeps in the kernel,
// the handler reads the fault, installs the page with UFFDIO_COPY and wakes it, two context
// switches per fault wherever the handler lives (inproc.c). With UFFD_FEATURE_SIGBUS the kernel
// raises SIGBUS in the faulting thread instead of queueing the fault, and a handler in that
// thread can install the page itself and return: no switch, only a signal delivery. This
// measures the three ways side by side on one CPU, a page at a time, each page's content copied
// from a distinct page of a 64 MiB store (as a store of evicted pages would be):
//
//   kernel   the kernel's own anonymous write fault on a page dropped with MADV_DONTNEED: a
//            page allocated and zeroed, no copy
//   thread   a uffd handler thread of the same process, pinned to the same CPU
//   process  a uffd handler in another process (a fork of this one, holding the same uffd),
//            pinned to the same CPU (farmem's way: its handler is in farmem's process)
//   forward  a thread of the faulting process reads the fault and passes it on a socket to
//            another process, which installs it (what a fault the program's own thread does
//            not serve would cost, were that thread the uffd's reader: docs/DESIGN.md, "Where a
//            fault is served")
//   sigbus   UFFD_FEATURE_SIGBUS: the faulting thread's SIGBUS handler does the UFFDIO_COPY
//   install  no fault: UFFDIO_COPY of each page ahead of the touch, as a prefetch would, then the
//            touch (what the install alone costs, of the two above)
//
//   cc -O2 -o sigbus probes/sigbus.c -lpthread
//   ./sigbus [pages] [rounds]      # one line per mode and round, the modes interleaved
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096UL
#define STORE_PAGES 16384UL // 64 MiB

static char *store;
static int sig_uffd = -1;
static unsigned long sig_faults;

static void pin(int c)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(c, &s);
	sched_setaffinity(0, sizeof s, &s);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static char *src_for(uint64_t addr) { return store + ((addr / PAGE) % STORE_PAGES) * PAGE; }

static int new_uffd(uint64_t features)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (fd < 0) {
		perror("userfaultfd");
		exit(1);
	}
	struct uffdio_api api = { .api = UFFD_API, .features = features };
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		perror("UFFDIO_API");
		exit(1);
	}
	return fd;
}

static void reg(int fd, char *r, size_t len)
{
	struct uffdio_register rg = { .range = { (uint64_t)r, len }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (ioctl(fd, UFFDIO_REGISTER, &rg) < 0) {
		perror("UFFDIO_REGISTER");
		exit(1);
	}
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	uint64_t a = (uint64_t)si->si_addr & ~(PAGE - 1);
	struct uffdio_copy c = { .dst = a, .src = (uint64_t)src_for(a), .len = PAGE };
	if (ioctl(sig_uffd, UFFDIO_COPY, &c) < 0 && c.copy != -EEXIST) {
		static const char m[] = "sigbus: UFFDIO_COPY failed\n";
		write(2, m, sizeof m - 1);
		_exit(1);
	}
	sig_faults++;
}

static void *serve(void *arg)
{
	int fd = *(int *)arg;
	pin(0);
	struct uffd_msg m;
	for (;;) {
		ssize_t n = read(fd, &m, sizeof m);
		if (n != sizeof m)
			continue;
		if (m.event != UFFD_EVENT_PAGEFAULT)
			continue;
		uint64_t a = m.arg.pagefault.address & ~(PAGE - 1);
		struct uffdio_copy c = { .dst = a, .src = (uint64_t)src_for(a), .len = PAGE };
		if (ioctl(fd, UFFDIO_COPY, &c) < 0 && c.copy != -EEXIST) {
			perror("UFFDIO_COPY");
			exit(1);
		}
	}
	return NULL;
}

// relay reads faults from the uffd and passes each, as read, on socket s (forward's thread).
static int relay_sock = -1;
static void *relay(void *arg)
{
	int fd = *(int *)arg;
	pin(0);
	struct uffd_msg m;
	for (;;) {
		if (read(fd, &m, sizeof m) != sizeof m)
			continue;
		if (write(relay_sock, &m, sizeof m) != sizeof m) {
			perror("relay write");
			exit(1);
		}
	}
	return NULL;
}

// install_relayed installs each fault read from socket s into the uffd fd (forward's other
// process).
static void install_relayed(int s, int fd)
{
	pin(0);
	struct uffd_msg m;
	while (read(s, &m, sizeof m) == sizeof m) {
		uint64_t a = m.arg.pagefault.address & ~(PAGE - 1);
		struct uffdio_copy c = { .dst = a, .src = (uint64_t)src_for(a), .len = PAGE };
		if (ioctl(fd, UFFDIO_COPY, &c) < 0 && c.copy != -EEXIST) {
			perror("UFFDIO_COPY (forwarded)");
			exit(1);
		}
	}
}

// touch reads one byte of every page of r (writes one, if write: a read of a missing page the
// kernel serves maps its shared zero page, which allocates nothing) and returns the time per page
// in microseconds.
static double touch(volatile char *r, size_t pages, int write, unsigned long *sum)
{
	double t0 = now();
	for (size_t i = 0; i < pages; i++) {
		if (write)
			r[i * PAGE] = 1;
		else
			*sum += (unsigned char)r[i * PAGE];
	}
	return (now() - t0) / pages * 1e6;
}

int main(int argc, char **argv)
{
	size_t pages = argc > 1 ? strtoul(argv[1], 0, 10) : 65536, len = pages * PAGE;
	int rounds = argc > 2 ? atoi(argv[2]) : 3;
	pin(0);
	store = mmap(0, STORE_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (size_t i = 0; i < STORE_PAGES * PAGE; i += 8)
		*(uint64_t *)(store + i) = i * 0x9e3779b97f4a7c15ULL;
	// A region a mode, each warmed (first touch of guest memory is the host's work) and dropped.
	enum { KERNEL, THREAD, BY_SIGNAL, INSTALL, PROCESS, FORWARD, MODES };
	char *r[MODES];
	for (int m = 0; m < MODES; m++) {
		r[m] = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		memset(r[m], 1, len);
		madvise(r[m], len, MADV_DONTNEED);
	}
	int tfd = new_uffd(0);
	reg(tfd, r[1], len);
	pthread_t th;
	pthread_create(&th, NULL, serve, &tfd);
	sig_uffd = new_uffd(UFFD_FEATURE_SIGBUS);
	reg(sig_uffd, r[2], len);
	struct sigaction sa = { .sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGBUS, &sa, NULL);
	int ifd = new_uffd(0);
	reg(ifd, r[3], len);
	// The other process serves from its copy of the store, the same bytes.
	int pfd = new_uffd(0);
	reg(pfd, r[PROCESS], len);
	pid_t server = fork();
	if (server == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		serve(&pfd);
		_exit(0);
	}
	int ffd = new_uffd(0), sv[2];
	reg(ffd, r[FORWARD], len);
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) {
		perror("socketpair");
		return 1;
	}
	pid_t installer = fork();
	if (installer == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(sv[0]);
		install_relayed(sv[1], ffd);
		_exit(0);
	}
	close(sv[1]);
	relay_sock = sv[0];
	pthread_t rth;
	pthread_create(&rth, NULL, relay, &ffd);
	usleep(10000);
	unsigned long sum = 0;
	printf("# sigbus: %zu pages a round, one CPU, content from a %lu MiB store\n", pages, STORE_PAGES * PAGE >> 20);
	static const char *name[MODES] = { "kernel", "thread", "sigbus", "install", "process", "forward" };
	static const int order[MODES] = { KERNEL, THREAD, PROCESS, FORWARD, BY_SIGNAL, INSTALL };
	for (int k = 0; k < rounds; k++) {
		for (int o = 0; o < MODES; o++) {
			int m = order[o];
			double us;
			if (m == INSTALL) {
				double t0 = now();
				for (size_t i = 0; i < pages; i++) {
					uint64_t a = (uint64_t)r[3] + i * PAGE;
					struct uffdio_copy c = { .dst = a, .src = (uint64_t)src_for(a), .len = PAGE };
					if (ioctl(ifd, UFFDIO_COPY, &c) < 0) {
						perror("UFFDIO_COPY");
						return 1;
					}
				}
				double t1 = now();
				us = touch(r[m], pages, 0, &sum);
				printf("round %d %-7s %.2f us per page installed, then %.2f us per touch\n", k, name[m], (t1 - t0) / pages * 1e6, us);
				madvise(r[m], len, MADV_DONTNEED);
				continue;
			}
			us = touch(r[m], pages, m == KERNEL, &sum);
			printf("round %d %-7s %.2f us per fault\n", k, name[m], us);
			// Drop the pages again for the next round: missing once more.
			madvise(r[m], len, MADV_DONTNEED);
		}
	}
	unsigned long want = 0;
	for (size_t i = 0; i < pages; i++)
		for (int m = THREAD; m < MODES; m++)
			want += (unsigned char)src_for((uint64_t)r[m] + i * PAGE)[0];
	printf("# sigbus faults served: %lu; check %s\n", sig_faults, sum == want * rounds ? "ok" : "WRONG");
	return sum == want * rounds ? 0 : 1;
}
