/* floorshim.so: the LD_PRELOAD half of floorpager, the minimal userfaultfd pager that measures
 * the floor of paging on a machine. It does what farmem's shim does for the eviction path and
 * nothing more:
 *
 *   - at load, creates the program's userfaultfd with the features farmem asks for (FORK,
 *     REMOVE, UNMAP and REMAP events, THREAD_ID, WP fault flags) and sends it to the pager over
 *     the control connection (SCM_RIGHTS); it keeps its own copy, so that a pager that dies
 *     leaves faulting threads hung (and killed with the pager's death signal), never reading
 *     zeros;
 *   - interposes mmap: each anonymous private writable mapping of at least FL_MIN_MAP is
 *     reported to the pager, which registers it (MISSING|WP, from its side, as farmem does)
 *     before mmap returns, so no page of it is touched unregistered. Only calls through the
 *     PLT are seen: glibc malloc's own mmaps are not, so what the pager manages is what the
 *     program maps itself (micro maps its whole footprint with one mmap);
 *   - runs an agent thread that executes the pager's eviction requests: UFFDIO_MOVE of a batch
 *     of pages into a staging area, and madvise(MADV_DONTNEED) of the staging area once the
 *     pager has read it. The pager cannot do either itself: UFFDIO_MOVE and madvise act on the
 *     caller's own memory. The staging area is registered on a uffd of its own with no event
 *     features (as farmem's make_staging does): a move must land in a registered range with the
 *     source's protection, and its drop then raises no REMOVE event for the pager to read.
 *
 * The pager leaves the two connections' fds open across its exec of the program and names
 * them in FLOOR_CTL_FD and FLOOR_AGENT_FD; without them the shim does nothing.
 *
 * With floorpager --inproc (FLOOR_INPROC set instead) the shim is the whole pager: it keeps the
 * uffd, registers the mappings it sees itself, and a thread of the program runs the pager's core
 * (floorcore.h) on the program's CPU: faults are served, and batches moved, copied and dropped,
 * without leaving the process. Its store, FIFO and samples are shared memory, so that none of
 * it counts as the program's anonymous memory, which the cap holds. It prints the summary line
 * at exit. This is the floor of a pager that serves faults from within the program's process,
 * beside the floor of farmem's design. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

static int active, ctl = -1, agent_sock = -1, ufd = -1, stage_ufd = -1;
static uint64_t stage;
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t make_staging(void);
static void shim_die(const char *s) __attribute__((noreturn));

/* ---- --inproc: the pager's core, run by a thread of this process */
static int inproc;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	char b[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(b, sizeof b, fmt, ap);
	va_end(ap);
	write(2, "floorpager: ", 12);
	write(2, b, n < 0 ? 0 : n < (int)sizeof b ? n : (int)sizeof b - 1);
	write(2, "\n", 1);
	kill(getpid(), SIGKILL);
	_exit(1);
}

#include "floorcore.h"

static int fl_move(const struct fl_run *runs, int n, uint64_t first, uint64_t *moved, uint64_t *agent_ns)
{
	uint64_t dst = staging + first * PG, done = 0, t0 = now_ns();
	int err = 0;
	for (int i = 0; i < n && !err; i++) {
		struct uffdio_move mv = { .dst = dst + done, .src = runs[i].addr, .len = runs[i].len, .mode = UFFDIO_MOVE_MODE_DONTWAKE };
		if (ioctl(stage_ufd, UFFDIO_MOVE, &mv) == 0) {
			done += runs[i].len;
			continue;
		}
		err = errno;
		if (mv.move > 0) done += mv.move;
	}
	*moved = done / PG, *agent_ns = now_ns() - t0;
	return err;
}

static const char *fl_staged(int nv)
{
	(void)nv;
	return (const char *)staging;
}

static int fl_drop(int nv, uint64_t *agent_ns)
{
	uint64_t t0 = now_ns();
	int err = madvise((void *)staging, nv * PG, MADV_DONTNEED) ? errno : 0;
	*agent_ns = now_ns() - t0;
	return err;
}

/* shared_map maps len bytes of shared anonymous memory: shmem, not the program's anonymous
 * memory; filled in now if populate. NULL on failure. */
static void *shared_map(uint64_t len, int populate)
{
	void *p = (void *)syscall(SYS_mmap, 0, len, PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE | (populate ? MAP_POPULATE : 0), -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static char *fl_store(uint64_t len) { return shared_map(len, 1); }
/* Not calloc: the program's malloc may be what called mmap, holding its own locks. */
static void *fl_zalloc(uint64_t len) { return shared_map(len, 0); }
static const char *fl_status_path(void) { return "/proc/self/status"; }
static int fl_gone(void) { return 0; }
static void fl_busy(int b) { (void)b; }

/* new_uffd makes the program's userfaultfd with the features farmem asks for (blocking: the
 * pager's fault thread sleeps in read(2) on it) and says which the kernel granted (features may
 * be NULL), or stops the program saying why. */
static int new_uffd(uint64_t *features)
{
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	int fd = dev < 0 ? -1 : ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC);
	if (dev >= 0) close(dev);
	if (fd < 0) shim_die("cannot create a userfaultfd (root, or access to /dev/userfaultfd)");
	struct uffdio_api api = { .api = UFFD_API,
		.features = UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP |
			    UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	if (ioctl(fd, UFFDIO_API, &api)) shim_die("UFFDIO_API refused the features");
	if (features) *features = api.features;
	return fd;
}

/* start_inproc pages this process from within, at a cap of the pages spec names. */
static void start_inproc(const char *spec)
{
	char *end;
	cap_pages = strtoull(spec, &end, 10);
	split_wake = *end == ',' ? atoi(end + 1) : 1;
	if (cap_pages < FL_BATCH) die("--inproc: the cap is below one batch");
	uffd = new_uffd(NULL);
	errno = 0;
	staging = stage = make_staging();
	if (!staging) die("no staging area");
	samples = shared_map(NSAMPLES * sizeof *samples, 0);
	fifo = shared_map(FIFO_CAP * sizeof *fifo, 0);
	if (!samples || !fifo) die("out of memory");
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old); /* the program's signals are for its own threads */
	if (pthread_create(&t, &at, fault_main, NULL)) die("cannot start the fault thread");
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&at);
	inproc = active = 1;
}

__attribute__((destructor)) static void fini(void)
{
	if (inproc) print_summary(now_ns(), 0);
}

static void shim_die(const char *s)
{
	/* No pager, no way to serve an evicted page: stop rather than run on. */
	write(2, "floorshim: ", 11);
	write(2, s, strlen(s));
	write(2, "\n", 1);
	kill(getpid(), SIGKILL);
	_exit(1);
}

static int send_msg(int s, const struct fl_msg *m, const void *extra, size_t elen, int fd)
{
	struct iovec iov[2] = { { (void *)m, sizeof *m }, { (void *)extra, elen } };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = elen ? 2 : 1 };
	if (fd >= 0) {
		memset(cbuf, 0, sizeof cbuf);
		mh.msg_control = cbuf, mh.msg_controllen = sizeof cbuf;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	ssize_t r;
	do r = sendmsg(s, &mh, MSG_NOSIGNAL); while (r < 0 && errno == EINTR);
	return r < 0 ? -1 : 0;
}

static ssize_t recv_all(int s, void *buf, size_t len)
{
	ssize_t r;
	do r = recv(s, buf, len, 0); while (r < 0 && errno == EINTR);
	return r;
}

/* The agent: one request at a time from the pager, each answered with its status and the time
 * its syscalls took inside the program (the pager times the round trip around it). */
static void *agent_main(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	struct fl_msg h = { .type = FL_AGENT_HELLO, .a = stage, .c = (uint64_t)syscall(SYS_gettid) };
	if (!stage) h.b = errno ? errno : EINVAL;
	if (send_msg(agent_sock, &h, NULL, 0, -1) < 0) shim_die("lost the pager");
	char buf[sizeof(struct fl_msg) + FL_BATCH * sizeof(struct fl_run)] __attribute__((aligned(8)));
	for (;;) {
		ssize_t n = recv_all(agent_sock, buf, sizeof buf);
		if (n <= 0) shim_die("lost the pager");
		struct fl_msg *m = (struct fl_msg *)buf, d = { 0 };
		if (m->type == FL_MOVE) {
			/* Runs go to consecutive staging pages from page m->a on. On an error the
			 * rest is left: the pager sees how many pages moved and why the next did not
			 * (EAGAIN: an event it has not read yet blocks every move until it does). */
			struct fl_run *runs = (struct fl_run *)(buf + sizeof *m);
			int nr = m->n;
			if ((size_t)n < sizeof *m + nr * sizeof *runs) nr = (n - sizeof *m) / sizeof *runs;
			uint64_t dst = stage + m->a * FL_PAGE, moved = 0, t0 = now_ns();
			for (int i = 0; i < nr && !d.b; i++) {
				struct uffdio_move mv = { .dst = dst + moved, .src = runs[i].addr, .len = runs[i].len,
							  .mode = UFFDIO_MOVE_MODE_DONTWAKE };
				if (ioctl(stage_ufd, UFFDIO_MOVE, &mv) == 0) {
					moved += runs[i].len;
					continue;
				}
				d.b = errno;
				if (mv.move > 0) moved += mv.move;
			}
			d.c = now_ns() - t0;
			d.type = FL_MOVE_DONE, d.a = moved / FL_PAGE;
		} else if (m->type == FL_DROP) {
			uint64_t t0 = now_ns();
			d.a = madvise((void *)stage, m->a * FL_PAGE, MADV_DONTNEED) ? errno : 0;
			d.b = now_ns() - t0;
			d.type = FL_DROP_DONE;
		} else
			continue;
		if (send_msg(agent_sock, &d, NULL, 0, -1) < 0) shim_die("lost the pager");
	}
	return NULL;
}

/* make_staging maps the staging area and registers it on stage_ufd; 0 and errno on failure. */
static uint64_t make_staging(void)
{
	size_t len = FL_BATCH * FL_PAGE;
	void *a = (void *)syscall(SYS_mmap, 0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED) return 0;
	madvise(a, len, MADV_NOHUGEPAGE); /* the program's pages are 4 KiB; keep their destination so */
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	stage_ufd = dev < 0 ? -1 : ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC);
	if (dev >= 0) close(dev);
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_MOVE };
	struct uffdio_register r = { .range = { (uint64_t)a, len }, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	if (stage_ufd < 0 || ioctl(stage_ufd, UFFDIO_API, &api) || ioctl(stage_ufd, UFFDIO_REGISTER, &r)) return 0;
	return (uint64_t)a;
}

__attribute__((constructor)) static void init(void)
{
	const char *in = getenv(FL_ENV_INPROC);
	if (in) {
		char spec[64];
		snprintf(spec, sizeof spec, "%s", in);
		unsetenv(FL_ENV_INPROC); /* not for what the program execs */
		start_inproc(spec);
		return;
	}
	const char *c = getenv(FL_ENV_CTL), *a = getenv(FL_ENV_AGENT);
	if (!c || !a) return;
	ctl = atoi(c), agent_sock = atoi(a);
	/* Not for what the program execs: the connections are this process's. */
	unsetenv(FL_ENV_CTL), unsetenv(FL_ENV_AGENT);
	fcntl(ctl, F_SETFD, FD_CLOEXEC), fcntl(agent_sock, F_SETFD, FD_CLOEXEC);

	uint64_t features;
	ufd = new_uffd(&features);
	struct fl_msg m = { .type = FL_HELLO, .a = features };
	if (send_msg(ctl, &m, NULL, 0, ufd) < 0 || recv_all(ctl, &m, sizeof m) != sizeof m || m.type != FL_HELLO_OK || m.a)
		shim_die("handshake with the pager failed");

	errno = 0;
	stage = make_staging();
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, 64 << 10);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &at, agent_main, NULL)) shim_die("cannot start the agent thread");
	pthread_attr_destroy(&at);
	active = 1;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	if (r == -1) return MAP_FAILED; /* syscall() set errno */
	if (active && (flags & MAP_ANONYMOUS) && (flags & (MAP_PRIVATE | MAP_SHARED)) == MAP_PRIVATE &&
	    (prot & PROT_WRITE) && len >= FL_MIN_MAP && !(flags & MAP_STACK)) {
		if (inproc) {
			pthread_mutex_lock(&reg_lock);
			int err = do_register((uint64_t)r, (len + FL_PAGE - 1) & ~(FL_PAGE - 1));
			pthread_mutex_unlock(&reg_lock);
			if (err) die("registering a mapping: %s", strerror(err));
			return (void *)r;
		}
		struct fl_msg m = { .type = FL_REGISTER, .a = (uint64_t)r, .b = (len + FL_PAGE - 1) & ~(FL_PAGE - 1) };
		pthread_mutex_lock(&ctl_lock);
		int bad = send_msg(ctl, &m, NULL, 0, -1) < 0 || recv_all(ctl, &m, sizeof m) != sizeof m;
		pthread_mutex_unlock(&ctl_lock);
		if (bad) shim_die("lost the pager");
		if (m.a) shim_die("the pager could not register a mapping");
	}
	return (void *)r;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));
