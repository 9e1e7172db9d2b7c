/* floorpager: the floor of userfaultfd paging on this machine, measured. A minimal steady-state
 * pager built the way farmem is (another process serves the program's faults through the uffd
 * its preload shim created and sent over; eviction by the shim's agent thread moving pages into a
 * staging area), with nothing farmem adds beyond that: no prefetch, no dirty tracking (every
 * victim is written), no policy beyond FIFO, a store that is a plain array of page slots.
 *
 *   floorpager --local-mem BYTES [--cpu N] [--combined-wake] -- PROGRAM ARGS...
 *
 * It runs PROGRAM with floorshim.so preloaded (FLOOR_SHIM, or beside this binary), pinned with
 * the pager to one CPU (--cpu, default the last one), as farmem pins its fault thread to the
 * faulting thread's CPU: a wakeup across CPUs costs far more than the round trip itself in this
 * VM. The mappings the shim reports are registered MISSING|WP from here. One fault thread reads
 * the uffd (blocking read) and serves each fault:
 *   - a page never touched (or discarded by the program): UFFDIO_ZEROPAGE for a read, a
 *     UFFDIO_COPY of zeros for a write (a zero page then written costs a second fault);
 *   - an evicted page: UFFDIO_COPY from its slot;
 * and, when the resident pages have reached the cap, first evicts a batch of up to FL_BATCH of
 * the oldest resident pages, inline, while the faulting thread waits anyway:
 *   move (the agent UFFDIO_MOVEs the victims, run by run, into the staging area) ->
 *   process_vm_readv of the staging area into a buffer -> store (memcpy into the slots) ->
 *   drop (the agent madvise(DONTNEED)s the staging area).
 * The staging area's uffd has no events, so the drop needs no REMOVE read; a moved page is out
 * of the program's reach (a fault on it would wait for this thread, which serves it from its
 * slot after the batch), so no write-protection is needed either.
 *
 * At exit it prints on stderr one line of key=value pairs (see print_summary): the counts, the
 * pages paged in per second, and the mean cost of each part. Times are clock_gettime(MONOTONIC)
 * around each step, on this side, and for the agent's syscalls on its side.
 *
 * Not supported, and refused rather than got wrong: fork (EVENT_FORK: the child's evicted
 * pages would read as zeros) and mremap of a registered range (EVENT_REMAP) end the program with
 * an error; a discard of a page inside an eviction batch in flight (possible only with several
 * faulting threads) likewise. munmap and madvise(DONTNEED) of registered memory are followed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

static int ctl = -1, agent = -1;
static char bounce[FL_BATCH * FL_PAGE] __attribute__((aligned(4096)));

static pid_t child = -1;
static atomic_int child_gone;
/* busy: the fault thread is handling what it read (the program may exit before the counters of
 * the fault that woke it last are updated). */
static atomic_int busy;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "floorpager: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	if (child > 0) kill(child, SIGKILL);
	exit(1);
}

#include "floorcore.h"

/* ---- agent requests */
static void agent_call(struct fl_msg *m, const void *extra, size_t elen, uint32_t want)
{
	struct iovec iov[2] = { { m, sizeof *m }, { (void *)extra, elen } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = elen ? 2 : 1 };
	if (sendmsg(agent, &mh, MSG_NOSIGNAL) < 0) die("agent: %s", strerror(errno));
	ssize_t n;
	do n = recv(agent, m, sizeof *m, 0); while (n < 0 && errno == EINTR);
	if (n != sizeof *m || m->type != want) die("agent: no answer (%s)", n < 0 ? strerror(errno) : "closed");
}

/* ---- the core's hooks: the program's memory is reached through its agent and /proc */
static int fl_move(const struct fl_run *runs, int n, uint64_t first, uint64_t *moved, uint64_t *agent_ns)
{
	struct fl_msg m = { .type = FL_MOVE, .n = n, .a = first };
	agent_call(&m, runs, n * sizeof runs[0], FL_MOVE_DONE);
	*moved = m.a, *agent_ns = m.c;
	return (int)m.b;
}

static const char *fl_staged(int nv)
{
	struct iovec l = { bounce, nv * PG }, r = { (void *)staging, nv * PG };
	ssize_t got = process_vm_readv(child, &l, 1, &r, 1, 0);
	if (got != (ssize_t)(nv * PG)) die("process_vm_readv: %zd of %lu bytes (%s)", got, nv * PG, strerror(errno));
	return bounce;
}

static int fl_drop(int nv, uint64_t *agent_ns)
{
	struct fl_msg m = { .type = FL_DROP, .a = nv };
	agent_call(&m, NULL, 0, FL_DROP_DONE);
	*agent_ns = m.b;
	return (int)m.a;
}

static char *fl_store(uint64_t len)
{
	char *s = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	return s == MAP_FAILED ? NULL : s;
}

static void *fl_zalloc(uint64_t len) { return calloc(len, 1); }

static const char *fl_status_path(void)
{
	static char path[64];
	snprintf(path, sizeof path, "/proc/%d/status", (int)child);
	return path;
}

static int fl_gone(void) { return atomic_load(&child_gone); }
static void fl_busy(int b) { atomic_store(&busy, b); }

/* ---- registration (the control thread) */
static void *ctl_main(void *arg)
{
	(void)arg;
	for (;;) {
		struct fl_msg m;
		ssize_t n = recv(ctl, &m, sizeof m, 0);
		if (n < 0 && errno == EINTR) continue;
		if (n != sizeof m) return NULL; /* the program is gone */
		if (m.type != FL_REGISTER) continue;
		m.a = do_register(m.a, m.b);
		m.type = FL_REGISTER_OK;
		send(ctl, &m, sizeof m, MSG_NOSIGNAL);
	}
}

/* ---- a TLB flush, estimated */

/* flush_estimate times, in a fresh process on this CPU (its mm has run nowhere else, like the
 * pinned program's, so its flushes are local), mprotect flipping one present page to read-only
 * and back against the same flips of an absent page: the difference is two PTE changes and their
 * single-page TLB flushes. The pager's own parts contain such flushes (each page UFFDIO_MOVE
 * moves, one per drop) that no timer can single out. */
static double flush_estimate(void)
{
	int p[2];
	if (pipe(p)) return 0;
	pid_t c = fork();
	if (c == 0) {
		enum { N = 2000 };
		char *b = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		b[0] = 1;
		double best = 1e18;
		for (int rep = 0; rep < 5; rep++) {
			uint64_t t[2];
			for (int w = 0; w < 2; w++) {
				char *pg = b + w * PG;
				uint64_t t0 = now_ns();
				for (int i = 0; i < N; i++) {
					mprotect(pg, PG, PROT_READ);
					mprotect(pg, PG, PROT_READ | PROT_WRITE);
				}
				t[w] = now_ns() - t0;
			}
			double d = ((double)t[0] - (double)t[1]) / (2.0 * N);
			if (d < best) best = d;
		}
		write(p[1], &best, sizeof best);
		_exit(0);
	}
	close(p[1]);
	double v = 0;
	if (read(p[0], &v, sizeof v) != sizeof v) v = 0;
	close(p[0]);
	waitpid(c, NULL, 0);
	return v < 0 ? 0 : v;
}

/* ---- main */
static uint64_t parse_size(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	uint64_t m = 1;
	if (!strcmp(end, "") || !strcasecmp(end, "b")) m = 1;
	else if (!strcasecmp(end, "k") || !strcasecmp(end, "kib") || !strcasecmp(end, "kb")) m = 1 << 10;
	else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib") || !strcasecmp(end, "mb")) m = 1 << 20;
	else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib") || !strcasecmp(end, "gb")) m = 1 << 30;
	else return 0;
	if (!(v > 0) || end == s) return 0;
	return (uint64_t)(v * m);
}

static void usage(void)
{
	fprintf(stderr, "usage: floorpager --local-mem BYTES [--cpu N] [--combined-wake] [--inproc] -- PROGRAM ARGS...\n"
			"  BYTES: a number with an optional K, M, G (KiB, MiB, GiB) suffix, at least %lu KiB\n"
			"  --cpu: the CPU the pager and the program run on (default: the last one)\n"
			"  --combined-wake: install and wake in one ioctl (default: the wake apart, timed apart)\n"
			"  --inproc: the shim serves the faults and evicts from a thread of the program itself, its\n"
			"            store shared memory; this process only starts the program and waits for it\n",
		FL_BATCH * PG >> 10);
	exit(2);
}

static int recv_fd(int s, struct fl_msg *m, int *fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { m, sizeof *m };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf };
	ssize_t n;
	do n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
	*fd = -1;
	struct cmsghdr *c = mh.msg_controllen ? CMSG_FIRSTHDR(&mh) : NULL;
	if (n > 0 && c && c->cmsg_type == SCM_RIGHTS) memcpy(fd, CMSG_DATA(c), sizeof(int));
	return n == sizeof *m ? 0 : -1;
}

/* exec_with_shim runs in the forked child: dies with the pager, preloads the shim before what
 * LD_PRELOAD held, and execs the program (or says why it could not, exit 127). */
static void exec_with_shim(pid_t parent, const char *shim, char **args)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent) _exit(1);
	const char *pre = getenv("LD_PRELOAD");
	char *lp;
	if (asprintf(&lp, "%s%s%s", shim, pre && *pre ? ":" : "", pre ? pre : "") < 0) _exit(127);
	setenv("LD_PRELOAD", lp, 1);
	execvp(args[0], args);
	fprintf(stderr, "floorpager: %s: %s\n", args[0], strerror(errno));
	_exit(127);
}

/* run_inproc runs the program with the shim told to page it from within (FL_ENV_INPROC: the
 * cap in pages, and whether it splits the wake), and exits as it did; the shim prints the
 * summary line. */
static int run_inproc(const char *shim, char **args, int split)
{
	pid_t parent = getpid();
	child = fork();
	if (child < 0) die("fork: %s", strerror(errno));
	if (child == 0) {
		char b[64];
		snprintf(b, sizeof b, "%lu,%d", (unsigned long)cap_pages, split);
		setenv(FL_ENV_INPROC, b, 1);
		exec_with_shim(parent, shim, args);
	}
	signal(SIGINT, SIG_IGN), signal(SIGTERM, SIG_IGN); /* they reach the program; we outlive it */
	int ws;
	while (waitpid(child, &ws, 0) < 0 && errno == EINTR)
		;
	if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
	return WEXITSTATUS(ws);
}

int main(int argc, char **argv)
{
	uint64_t cap = 0;
	int cpu = -1, inproc = 0, i;
	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--")) { i++; break; }
		if (!strcmp(argv[i], "--local-mem") && i + 1 < argc) cap = parse_size(argv[++i]);
		else if (!strcmp(argv[i], "--cpu") && i + 1 < argc) cpu = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--combined-wake")) split_wake = 0;
		else if (!strcmp(argv[i], "--inproc")) inproc = 1;
		else usage();
	}
	if (i >= argc || cap == 0) usage();
	cap_pages = cap / PG;
	if (cap_pages < FL_BATCH) {
		fprintf(stderr, "floorpager: --local-mem must be at least one batch, %lu KiB\n", FL_BATCH * PG >> 10);
		return 2;
	}

	/* The shim: FLOOR_SHIM, or floorshim.so beside this binary. */
	char shim[PATH_MAX];
	const char *env = getenv(FL_ENV_SHIM);
	if (env) snprintf(shim, sizeof shim, "%s", env);
	else {
		ssize_t n = readlink("/proc/self/exe", shim, sizeof shim - 32);
		if (n <= 0) die("cannot find myself: %s", strerror(errno));
		shim[n] = 0;
		char *slash = strrchr(shim, '/');
		strcpy(slash ? slash + 1 : shim, "floorshim.so");
	}
	if (access(shim, R_OK)) die("the shim %s: %s (set %s)", shim, strerror(errno), FL_ENV_SHIM);

	/* One CPU for the pager and the program, from the start: what they inherit. */
	cpu_set_t set;
	if (cpu < 0) {
		CPU_ZERO(&set);
		sched_getaffinity(0, sizeof set, &set);
		for (int c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set)) cpu = c;
	}
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof set, &set)) die("pinning to CPU %d: %s", cpu, strerror(errno));
	if (inproc) return run_inproc(shim, argv + i, split_wake);
	double flush_ns = flush_estimate();
	samples = malloc(NSAMPLES * sizeof *samples);
	fifo = mmap(NULL, FIFO_CAP * sizeof *fifo, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!samples || fifo == MAP_FAILED) die("out of memory");

	int cs[2], as[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, cs) || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, as))
		die("socketpair: %s", strerror(errno));
	pid_t parent = getpid();
	child = fork();
	if (child < 0) die("fork: %s", strerror(errno));
	if (child == 0) {
		/* The child's ends stay open across exec (dup2 clears CLOEXEC). */
		int c = dup2(cs[1], 100), a = dup2(as[1], 101);
		char b[16];
		snprintf(b, sizeof b, "%d", c);
		setenv(FL_ENV_CTL, b, 1);
		snprintf(b, sizeof b, "%d", a);
		setenv(FL_ENV_AGENT, b, 1);
		exec_with_shim(parent, shim, argv + i);
	}
	close(cs[1]), close(as[1]);
	ctl = cs[0], agent = as[0];
	signal(SIGINT, SIG_IGN), signal(SIGTERM, SIG_IGN); /* they reach the program; we outlive it */

	struct fl_msg m;
	if (recv_fd(ctl, &m, &uffd) || m.type != FL_HELLO || uffd < 0) {
		int ws;
		waitpid(child, &ws, 0);
		child = -1;
		if (WIFEXITED(ws) && WEXITSTATUS(ws) == 127) return 127; /* exec failed: said so */
		die("no hello from the program's shim (is %s loadable by it, statically linked?)", shim);
	}
	m = (struct fl_msg){ .type = FL_HELLO_OK };
	send(ctl, &m, sizeof m, MSG_NOSIGNAL);
	pthread_t tc, tf;
	if (pthread_create(&tc, NULL, ctl_main, NULL)) die("pthread_create");
	if (recv_fd(agent, &m, &(int){ 0 }) || m.type != FL_AGENT_HELLO) die("no hello from the agent");
	if (!m.a) die("the agent has no staging area: %s", strerror((int)m.b));
	staging = m.a;
	if (pthread_create(&tf, NULL, fault_main, NULL)) die("pthread_create");

	int ws;
	while (waitpid(child, &ws, 0) < 0 && errno == EINTR)
		;
	uint64_t t_end = now_ns();
	atomic_store(&child_gone, 1);
	for (int k = 0; k < 1000 && atomic_load(&busy); k++) usleep(1000);
	print_summary(t_end, flush_ns);
	if (WIFSIGNALED(ws)) return 128 + WTERMSIG(ws);
	return WEXITSTATUS(ws);
}
