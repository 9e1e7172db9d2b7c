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
 *   4. re-arms itself in a fork child, fork()'s (atfork handler) or _Fork()'s (interposed): the
 *      inherited uffd points at the parent's mm, so it is closed and a fresh one sent in the
 *      child's HELLO. If the parent had ranges registered, the
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
/* hello_pid: the process that said hello on ctl. The child of a raw fork system call (no atfork
 * handler runs in it) has its parent's ctl: farmem enters it with an agent of its own
 * (launcher/rawfork.go), and its mappings are not this connection's to register (mmap). */
static long hello_pid;
static pthread_mutex_t ctl_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int init_spin;

/* sock_path: FARMEM_SOCK as the program started, kept where a fork child can read it without
 * getenv (the program may change its environment; a _Fork() child may not call getenv). */
static char sock_path[108];

static int connect_rt(void) { return connect_path(sock_path); }

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

/* start_agent starts the agent thread and, if the run is armed, waits until the runtime has
 * attached it. Until then an armed run has no mapping filter on this process, and what the
 * program mallocs meanwhile (glibc's internal mmaps) would be written unseen until the rescan
 * finds it, past the cap; the wait is one round trip, once per process. A run not armed
 * registers nothing, and its arming rescans every process: its processes (a fork child, an image
 * exec'd, at every fork and exec of a program that makes processes) go on at once, their agent
 * attached meanwhile. */
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
	while (run_armed && sem_wait(&agent_ready) != 0 && errno == EINTR)
		;
}

static void init(void)
{
	while (__atomic_exchange_n(&init_spin, 1, __ATOMIC_ACQUIRE)) ;
	if (state != 0) goto out;
	state = -1;
	const char *path = getenv("FARMEM_SOCK");
	if (!path) goto out;
	size_t n = strlen(path);
	memcpy(sock_path, path, n < sizeof sock_path ? n : sizeof sock_path - 1);
	ctl = connect_rt();
	if (ctl < 0) { say("cannot reach the farmem runtime (FARMEM_SOCK)"); die_runtime_lost(); }
	uint64_t features;
	int api_left;
	if ((ufd = new_uffd(&features, &api_left)) < 0) die_runtime_lost();
	if (hello(api_left ? API_LEFT : 0, features) < 0) { say("handshake with the farmem runtime failed"); die_runtime_lost(); }
	hello_pid = raw6(SYS_getpid, 0, 0, 0, 0, 0, 0);
	/* The agent thread is started from the constructor, not here: init may run inside the
	 * allocator's own first mmap (jemalloc), where pthread_create's allocation would deadlock
	 * on the allocator's init lock. */
	state = 1;
out:
	__atomic_store_n(&init_spin, 0, __ATOMIC_RELEASE);
}

/* A fork waits for the agent's moves in flight, and none starts until the fork is done
 * (move_lock in agent.h says why). */
static void atfork_prepare(void) { lock_moves(); }
static void atfork_parent(void) { unlock_moves(); }

/* rearm_child: 4., in a fork child, with the shim active: the child's own hello, uffd and
 * lifeline (fork_child_hello), and an agent thread of its own. */
static void rearm_child(void)
{
	__atomic_store_n(&move_lock, 0, __ATOMIC_RELEASE); /* the child's agent is not the parent's */
	pthread_mutex_init(&ctl_lock, NULL);
	fork_child_hello(sock_path);
	hello_pid = raw6(SYS_getpid, 0, 0, 0, 0, 0, 0);
}

static void atfork_child(void)
{
	if (state != 1) {
		__atomic_store_n(&move_lock, 0, __ATOMIC_RELEASE);
		return;
	}
	rearm_child();
	start_agent();
}

/* glibc's _Fork() is fork() without the atfork handlers, for where only async-signal-safe calls
 * may be made (a signal handler; the child of a multithreaded process, which every process with
 * the shim is). glibc's own fork() calls it internally, not through here. Its child is re-armed
 * as fork()'s is, with what is safe there: raw system calls, and an agent thread started as the
 * injected agent starts its own (clone_thread), not with pthread_create, which may wait in the
 * child on a lock a thread of the parent held at the fork. Not re-armed, the child would be served
 * on its FORK event alone, its evicted pages held by a uffd only farmem has: farmem's death
 * would leave it reading zeros where they were. */
static pid_t (*next_Fork)(void);
static uint64_t child_agent_stack; /* a _Fork() child's agent stack: [stack, stack+AGENT_STACK) */
#define AGENT_STACK (64 << 10)

static void child_agent_main(void)
{
	agent_sock = connect_rt();
	if (agent_sock < 0) die_runtime_lost();
	agent_serve(child_agent_stack, AGENT_STACK);
	for (;;) raw6(SYS_exit, 0, 0, 0, 0, 0, 0);
}

pid_t _Fork(void)
{
	if (!next_Fork) next_Fork = (pid_t (*)(void))dlsym(RTLD_NEXT, "_Fork");
	if (!next_Fork) { errno = ENOSYS; return -1; }
	if (state != 1) return next_Fork();
	lock_moves();
	pid_t pid = next_Fork();
	if (pid != 0) {
		unlock_moves();
		return pid;
	}
	rearm_child();
	long stk = exempt6(SYS_mmap, 0, AGENT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (stk < 0 && stk > -4096) die_runtime_lost();
	child_agent_stack = stk;
	sem_init(&agent_ready, 0, 0);
	if (clone_thread(stk + AGENT_STACK, child_agent_main) < 0) die_runtime_lost();
	while (run_armed && sem_wait(&agent_ready) != 0 && errno == EINTR)
		;
	return 0;
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
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
	next_Fork = (pid_t (*)(void))dlsym(RTLD_NEXT, "_Fork"); /* here: dlsym is not async-signal-safe */
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
	int registrable = state == 1 && (flags & MAP_ANONYMOUS) && (flags & (MAP_PRIVATE | MAP_SHARED)) == MAP_PRIVATE &&
			  (prot & PROT_WRITE) && len >= min_map && !(flags & MAP_STACK);
	if (registrable && raw6(SYS_getpid, 0, 0, 0, 0, 0, 0) != hello_pid) {
		/* A raw fork's child (hello_pid): not exempt, so that the mapping filter hands the
		 * call over, as it does a static program's. */
		long r = raw6(SYS_mmap, (long)addr, len, prot, flags, fd, off);
		if (r < 0 && r > -4096) { errno = -r; return MAP_FAILED; }
		return (void *)r;
	}
	long r = exempt6(SYS_mmap, (long)addr, len, prot, flags, fd, off);
	if (r < 0 && r > -4096) { errno = -r; return MAP_FAILED; }
	if (registrable) register_range((uint64_t)r, (len + 4095) & ~4095UL);
	return (void *)r;
}
void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) __attribute__((alias("mmap")));
