/* libfarmem.so: the LD_PRELOAD agent farmem puts inside the program.
 *
 * It does six things and nothing else (docs/DESIGN.md, "How a page moves"):
 *   1. creates the program's userfaultfd and hands it to the runtime (SCM_RIGHTS) in a HELLO on
 *      the control connection; it keeps its own copy so that, should the runtime die, a faulting
 *      thread hangs (and is killed) instead of reading zeros;
 *   2. asks the runtime to register each new anonymous private writable mapping it sees through
 *      the interposed mmap, and waits for the answer so no page of it is touched unregistered;
 *   3. runs an agent thread that executes the runtime's eviction requests: UFFDIO_MOVE of a
 *      batch's victims into a staging area the runtime then reads and has dropped, and
 *      madvise(MADV_DONTNEED) of page runs the runtime has already write-protected and copied out
 *      (the runtime cannot take another process's pages itself: process_madvise(DONTNEED) of
 *      another process is EINVAL, and so is UFFDIO_MOVE issued from another process; of the caller
 *      itself both are allowed, and process_madvise is how the agent drops a batch at once);
 *   4. re-arms itself in a fork child: the inherited uffd points at the parent's mm, so it is
 *      closed and a fresh one sent in the child's HELLO. If the parent had ranges registered, the
 *      child's belong to the uffd the kernel handed the runtime in the FORK event instead, which
 *      the runtime sends back as the child's keep-alive copy;
 *   5. when the runtime arms, installs (from the agent thread, for every thread: TSYNC) a seccomp
 *      filter that hands the runtime every anonymous private mmap and every brk the interposed
 *      mmap cannot see (glibc malloc's internal calls) as a user notification; the runtime has the
 *      agent perform the call (SYSCALL), registers the result, and only then lets the caller
 *      return, so no page of it is touched unregistered. The agent's own calls, and the
 *      interposed mmap (which registers by itself), go through one syscall instruction the filter
 *      lets pass: exempt6;
 *   6. gives each thread the program starts the program's own CPU affinity when the starting
 *      thread holds just one CPU that the program did not ask for: farmem pins the thread that
 *      faults to its CPU (runtime/placement.go), and what that thread starts would inherit it.
 *
 * Everything runs on raw syscalls: mmap is called from inside allocators (jemalloc's init) before
 * libc is fully usable. The agent thread's work (3 and 5) and the wire format (launcher/proto.go)
 * are in agent.h, shared with the agent farmem injects into a statically linked program (agent.c),
 * which does 1 from outside (package inject) and has no 2, 4 or 6.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"

static int state; /* 0 = not yet initialised, 1 = active, -1 = disabled (no FARMEM_SOCK) */
static int ctl = -1, ufd = -1;
static uint64_t min_map = 1 << 20;
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int init_spin;

static int connect_rt(void)
{
	const char *path = getenv("FARMEM_SOCK");
	return path ? connect_path(path) : -1;
}

static sem_t agent_ready; /* posted on MSG_AGENT_READY; start_agent waits for it */
static void fm_agent_ready(void) { sem_post(&agent_ready); }

static void *agent_main(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* the program's signal handlers must not run here */
	uint64_t stk = 0, stksz = 0;
	pthread_attr_t at;
	void *a;
	size_t n;
	if (pthread_getattr_np(pthread_self(), &at) == 0) {
		if (pthread_attr_getstack(&at, &a, &n) == 0) stk = (uint64_t)a, stksz = n;
		pthread_attr_destroy(&at);
	}
	agent_serve(stk, stksz);
	return NULL;
}

/* start_agent starts the agent thread and waits until the runtime has attached it. Until then an
 * armed run has no mapping filter on this process, and what the program mallocs meanwhile
 * (glibc's internal mmaps: the torture's first arrays, 2.4 MB) would be written unseen until the
 * rescan finds it, past the cap; the wait is one round trip, once per process. */
static void start_agent(void)
{
	sem_init(&agent_ready, 0, 0);
	agent_sock = connect_rt();
	if (agent_sock < 0) die_runtime_lost();
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, 64 << 10);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &at, agent_main, NULL)) die_runtime_lost();
	pthread_attr_destroy(&at);
	while (sem_wait(&agent_ready) != 0 && errno == EINTR)
		;
}

/* make_lifeline returns the write end of a new pipe, for the runtime to hold, and keeps the read
 * end in lifeline, set to SIGKILL this process once no writer is left (O_ASYNC signals a pipe's
 * readers when its last writer closes; F_SETSIG makes that signal SIGKILL). The runtime holds the
 * only write end until the process's control connection ends, so the kill comes exactly when the
 * runtime dies first. Nothing else can end a process whose threads wait on the dead runtime:
 * a fault on an evicted page, or the agent's drop waiting for its REMOVE to be read, sleeps until
 * SIGKILL; the agent cannot notice the runtime's end while it is the one waiting; and only the
 * program farmem started gets farmem's parent-death signal, not a fork child such as redis's
 * BGSAVE, which without it hangs in handle_userfault forever. -1: no lifeline (the process
 * then still has the agent's end-of-connection check). */
static int lifeline = -1;
static int make_lifeline(void)
{
	int p[2];
	if (raw6(SYS_pipe2, (long)p, O_CLOEXEC, 0, 0, 0, 0) < 0) return -1;
	if (raw6(SYS_fcntl, p[0], F_SETOWN, raw6(SYS_getpid, 0, 0, 0, 0, 0, 0), 0, 0, 0) < 0 ||
	    raw6(SYS_fcntl, p[0], F_SETSIG, SIGKILL, 0, 0, 0) < 0 ||
	    raw6(SYS_fcntl, p[0], F_SETFL, O_ASYNC | O_NONBLOCK, 0, 0, 0) < 0) {
		raw6(SYS_close, p[0], 0, 0, 0, 0, 0);
		raw6(SYS_close, p[1], 0, 0, 0, 0, 0);
		return -1;
	}
	lifeline = p[0];
	return p[1];
}

/* hello performs the handshake on a fresh control connection, sending our uffd and our lifeline's
 * write end. fork_child: if the parent had ranges registered when it forked, the runtime serves us
 * on the uffd of the parent's FORK event instead and sends it back as our keep-alive copy. */
static int hello(int fork_child, uint64_t features)
{
	struct fm_msg h = { .type = MSG_HELLO, .version = PROTO_VERSION, .pid = raw6(SYS_getpid, 0, 0, 0, 0, 0, 0),
			    .a = raw6(SYS_getppid, 0, 0, 0, 0, 0, 0), .b = features, .c = fork_child };
	int w = make_lifeline();
	long sent = send_msg2(ctl, &h, sizeof h, ufd, w);
	if (w >= 0) raw6(SYS_close, w, 0, 0, 0, 0, 0); /* the runtime's copy is the only writer now */
	if (sent < 0) return -1;
	struct fm_msg r;
	int fd = -1;
	if (recv_msg(ctl, &r, sizeof r, &fd) != sizeof r || r.type != MSG_HELLO_OK) return -1;
	if (r.a) return -1;
	if (r.b) min_map = r.b;
	if (fd >= 0) {
		raw6(SYS_close, ufd, 0, 0, 0, 0, 0);
		ufd = fd;
	}
	return 0;
}

/* new_uffd creates this process's userfaultfd with the features the runtime relies on. */
static int new_uffd(uint64_t *features)
{
	int fd = open_uffd();
	if (fd < 0) { say("cannot create a userfaultfd (need root or access to /dev/userfaultfd)"); return -1; }
	struct uffdio_api api = { .api = UFFD_API,
		.features = UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP |
			    UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	if (raw6(SYS_ioctl, fd, UFFDIO_API, (long)&api, 0, 0, 0) < 0) { say("UFFDIO_API refused the features farmem needs"); return -1; }
	*features = api.features;
	return fd;
}

static void init(void)
{
	while (__atomic_exchange_n(&init_spin, 1, __ATOMIC_ACQUIRE)) ;
	if (state != 0) goto out;
	state = -1;
	if (!getenv("FARMEM_SOCK")) goto out;
	ctl = connect_rt();
	if (ctl < 0) { say("cannot reach the farmem runtime (FARMEM_SOCK)"); die_runtime_lost(); }
	uint64_t features;
	if ((ufd = new_uffd(&features)) < 0) die_runtime_lost();
	if (hello(0, features) < 0) { say("handshake with the farmem runtime failed"); die_runtime_lost(); }
	/* The agent thread is started from the constructor, not here: init may run inside the
	 * allocator's own first mmap (jemalloc), where pthread_create's allocation would deadlock
	 * on the allocator's init lock. */
	state = 1;
out:
	__atomic_store_n(&init_spin, 0, __ATOMIC_RELEASE);
}

static void atfork_child(void)
{
	if (state != 1) return;
	/* Our inherited ctl/agent sockets and uffd are the parent's; leave them to it. */
	raw6(SYS_close, ctl, 0, 0, 0, 0, 0);
	raw6(SYS_close, agent_sock, 0, 0, 0, 0, 0);
	raw6(SYS_close, ufd, 0, 0, 0, 0, 0);
	if (lifeline >= 0) raw6(SYS_close, lifeline, 0, 0, 0, 0, 0); /* the parent's: it signals the parent */
	lifeline = -1;
	if (drop_pidfd >= 0) raw6(SYS_close, drop_pidfd, 0, 0, 0, 0, 0); /* the parent's: see drop_pidfd */
	drop_pidfd = -1;
	/* The parent's staging area was copied, unregistered: the runtime may read pages the parent
	 * had staged from it (its page table's Stage), so it stays; this process moves nothing. */
	if (stage_ufd >= 0) raw6(SYS_close, stage_ufd, 0, 0, 0, 0, 0);
	stage_ufd = -1;
	pthread_mutex_init(&ctl_lock, NULL);
	uint64_t features;
	ctl = connect_rt();
	ufd = new_uffd(&features);
	if (ctl < 0 || ufd < 0 || hello(1, features) < 0) { say("fork child could not reach the farmem runtime"); die_runtime_lost(); }
	start_agent();
}

/* 6. The program's own affinity, from when it started (a fork child keeps its parent's). Cleared
 * for good once the program sets an affinity itself: from then on what its threads inherit is
 * its choice, not a pinning of farmem's. */
static cpu_set_t own_cpus;
static int have_own_cpus;
/* Set around the shim's own pthread_setaffinity_np (in pthread_create): not the program's choice. */
static __thread int shim_sets_affinity;

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	static int (*next)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
	if (!next) next = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(RTLD_NEXT, "pthread_create");
	int r = next(t, attr, fn, arg);
	cpu_set_t cur;
	if (r == 0 && __atomic_load_n(&have_own_cpus, __ATOMIC_RELAXED) &&
	    sched_getaffinity(0, sizeof cur, &cur) == 0 && CPU_COUNT(&cur) == 1 && !CPU_EQUAL(&cur, &own_cpus)) {
		shim_sets_affinity = 1;
		pthread_setaffinity_np(*t, sizeof own_cpus, &own_cpus);
		shim_sets_affinity = 0;
	}
	return r;
}

int sched_setaffinity(pid_t pid, size_t size, const cpu_set_t *set)
{
	__atomic_store_n(&have_own_cpus, 0, __ATOMIC_RELAXED);
	long r = raw6(SYS_sched_setaffinity, pid, size, (long)set, 0, 0, 0);
	if (r < 0) { errno = -r; return -1; }
	return 0;
}

int pthread_setaffinity_np(pthread_t t, size_t size, const cpu_set_t *set)
{
	static int (*next)(pthread_t, size_t, const cpu_set_t *);
	if (!next) next = (int (*)(pthread_t, size_t, const cpu_set_t *))dlsym(RTLD_NEXT, "pthread_setaffinity_np");
	if (!shim_sets_affinity) __atomic_store_n(&have_own_cpus, 0, __ATOMIC_RELAXED);
	return next(t, size, set);
}

__attribute__((constructor)) static void ctor(void)
{
	have_own_cpus = sched_getaffinity(0, sizeof own_cpus, &own_cpus) == 0 && CPU_COUNT(&own_cpus) > 1;
	if (state == 0) init();
	if (state == 1) start_agent();
	pthread_atfork(NULL, NULL, atfork_child);
}

static void register_range(uint64_t addr, uint64_t len)
{
	struct fm_msg m = { .type = MSG_REGISTER, .version = PROTO_VERSION, .a = addr, .b = len };
	pthread_mutex_lock(&ctl_lock);
	long r = send_msg(ctl, &m, sizeof m, -1);
	if (r >= 0) r = recv_msg(ctl, &m, sizeof m, NULL);
	pthread_mutex_unlock(&ctl_lock);
	if (r <= 0) die_runtime_lost();
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	if (state == 0) init();
	long r = exempt6(SYS_mmap, (long)addr, len, prot, flags, fd, off);
	if (r < 0 && r > -4096) { errno = -r; return MAP_FAILED; }
	if (state == 1 && (flags & MAP_ANONYMOUS) && (flags & (MAP_PRIVATE | MAP_SHARED)) == MAP_PRIVATE &&
	    (prot & PROT_WRITE) && len >= min_map && !(flags & MAP_STACK))
		register_range((uint64_t)r, (len + 4095) & ~4095UL);
	return (void *)r;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));
