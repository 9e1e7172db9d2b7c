/* agent.h: what farmem's agent does inside a program, shared by the two ways farmem puts it
 * there: libfarmem.so, preloaded (shim.c), and the freestanding agent farmem injects into a
 * program it cannot preload into, a statically linked one (agent.c, through package inject).
 * Included once by each; it defines the wire format (launcher/proto.go has the Go side), the raw
 * system calls, the mapping filter, and the agent thread's loop: eviction requests (move, drop),
 * the staging area, the filter, the system calls the runtime has it make.
 *
 * Freestanding: no libc function but memcpy, memset and strlen (which the includer provides
 * when it has no libc), no TLS, no errno; everything else is a raw system call. The includer
 * defines fm_agent_ready, what happens when the runtime says the agent is attached. */
#ifndef FARMEM_AGENT_H
#define FARMEM_AGENT_H
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>

#define FM_SYS_clone3 435 /* our build headers may predate it */

static void fm_agent_ready(void);

enum {
	MSG_HELLO = 1,        /* shim->rt: a=ppid b=features c=flags(1=fork child); a fresh uffd attached */
	MSG_HELLO_OK = 2,     /* rt->shim: a=status(0 ok, else errno) b=min mapping bytes to register c=1 if
			       * the run is armed; a fork child's FORK-event uffd attached if it is served
			       * on that one */
	MSG_REGISTER = 3,     /* shim->rt: a=addr b=len */
	MSG_REGISTER_OK = 4,  /* rt->shim: a=status */
	MSG_AGENT_HELLO = 5,  /* shim->rt on the agent connection: a=tid */
	MSG_EVICT = 6,        /* rt->shim: n runs follow the header */
	MSG_EVICT_DONE = 7,   /* shim->rt: a=first errno (0 if all ok) */
	MSG_FILTER = 8,       /* rt->agent: a=min mapping bytes b=1: guard forks too; install the mapping filter */
	MSG_FILTER_OK = 9,    /* agent->rt: a=status (0 ok, else errno); the listener fd attached */
	MSG_SYSCALL = 10,     /* rt->agent: a=nr; six u64 arguments follow the header */
	MSG_SYSCALL_DONE = 11, /* agent->rt: a=the raw result (-errno on failure) */
	MSG_AGENT_READY = 12, /* rt->agent: the agent is attached (and, in an armed run, the mapping
			       * filter installed): the thread that started it may go on */
	MSG_MOVE = 13,        /* rt->agent: a=dst b=pages c=the layout events the batch's choice saw
			       * (move_runs); n runs follow: move their pages, in order, to consecutive
			       * pages from dst on (the staging area) */
	MSG_MOVE_DONE = 14,   /* agent->rt: n=pages; a status byte a page follows (0 moved, else errno) */
	MSG_STAGING = 15,     /* rt->agent: a=bytes; map the staging area (see make_staging); the move
			       * fence's memfd attached */
	MSG_STAGING_OK = 16,  /* agent->rt: a=its address (0: none), b=errno */
	MSG_DETACH = 17,      /* rt->agent: farmem lets the process go (farmem attach): unmap the staging
			       * area, close every descriptor of farmem's, answer, and end the thread */
	MSG_DETACH_OK = 18,   /* agent->rt: done; the thread exits right after */
	MSG_UFFD_DEV = 19,    /* shim->rt, before HELLO: send a /dev/userfaultfd descriptor (new_uffd) */
	MSG_UFFD_DEV_OK = 20, /* rt->shim: a=status (0 ok, else errno); the descriptor attached */
	MSG_FAULTS = 21,      /* rt->agent: serve faults (fault_thread); the table's memfd, the store
			       * space (read-only) and the socket to send the rest on attached */
	MSG_FAULTS_OK = 22,   /* agent->rt: a=status (0 ok, else errno) b=the fault thread's id */
	PROTO_VERSION = 8,
	MAX_RUNS = 128,
	MAX_MOVE_PAGES = 256,
};
struct fm_msg {
	uint32_t type, version;
	int32_t pid, n;
	uint64_t a, b, c;
};
struct fm_run { uint64_t addr, len; };

static long raw6(long n, long a, long b, long c, long d, long e, long f)
{
	long ret;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
	return ret;
}

/* exempt6 is raw6 through the one syscall instruction the mapping filter lets pass (its address
 * is fm_exempt_ip, the instruction after it, which is what seccomp reports). Never inlined: there
 * must be exactly one such instruction. */
extern const char fm_exempt_ip[];
__attribute__((noinline)) static long exempt6(long n, long a, long b, long c, long d, long e, long f)
{
	long ret;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	__asm__ volatile("syscall\n.globl fm_exempt_ip\n.hidden fm_exempt_ip\nfm_exempt_ip:"
			 : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9) : "rcx", "r11", "memory");
	return ret;
}

static void say(const char *s)
{
	raw6(SYS_write, 2, (long)"farmem shim: ", 13, 0, 0, 0);
	raw6(SYS_write, 2, (long)s, strlen(s), 0, 0, 0);
	raw6(SYS_write, 2, (long)"\n", 1, 0, 0, 0);
}

/* The runtime is gone: nobody can serve this program's evicted pages any more. Stop it rather
 * than let it run on (docs/DESIGN.md, "Invariants", 3). */
static void die_runtime_lost(void)
{
	say("lost the farmem runtime; stopping the program (its evicted pages cannot be served)");
	raw6(SYS_kill, raw6(SYS_getpid, 0, 0, 0, 0, 0, 0), SIGKILL, 0, 0, 0, 0);
	for (;;) raw6(SYS_pause, 0, 0, 0, 0, 0, 0);
}

/* connect_path connects to the runtime's socket at path ('@': the abstract namespace). */
static int connect_path(const char *path)
{
	int s = raw6(SYS_socket, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, 0, 0, 0);
	if (s < 0) return -1;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t n = strlen(path);
	if (n >= sizeof sa.sun_path) n = sizeof sa.sun_path - 1;
	memcpy(sa.sun_path, path, n);
	if (path[0] == '@') sa.sun_path[0] = 0; /* abstract namespace */
	if (raw6(SYS_connect, s, (long)&sa, offsetof(struct sockaddr_un, sun_path) + n, 0, 0, 0) < 0) {
		raw6(SYS_close, s, 0, 0, 0, 0, 0);
		return -1;
	}
	return s;
}

/* send_msg2 sends a message with up to two fds (a negative fd: none; fd2 only with fd). */
static long send_msg2(int s, const void *buf, size_t len, int fd, int fd2)
{
	struct iovec iov = { (void *)buf, len };
	char cbuf[CMSG_SPACE(2 * sizeof(int))];
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (fd >= 0) {
		int fds[2] = { fd, fd2 }, n = fd2 >= 0 ? 2 : 1;
		memset(cbuf, 0, sizeof cbuf);
		mh.msg_control = cbuf, mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(n * sizeof(int));
		memcpy(CMSG_DATA(c), fds, n * sizeof(int));
	}
	long r;
	do r = raw6(SYS_sendmsg, s, (long)&mh, MSG_NOSIGNAL, 0, 0, 0); while (r == -EINTR);
	return r;
}

static long send_msg(int s, const void *buf, size_t len, int fd) { return send_msg2(s, buf, len, fd, -1); }

static long recv_msg(int s, void *buf, size_t len, int *fd)
{
	struct iovec iov = { buf, len };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf };
	long r;
	do r = raw6(SYS_recvmsg, s, (long)&mh, MSG_CMSG_CLOEXEC, 0, 0, 0); while (r == -EINTR);
	if (fd) {
		*fd = -1;
		struct cmsghdr *c = mh.msg_controllen ? CMSG_FIRSTHDR(&mh) : NULL;
		if (r > 0 && c && c->cmsg_type == SCM_RIGHTS) memcpy(fd, CMSG_DATA(c), sizeof(int));
	}
	return r;
}

/* recv_msg_fds is recv_msg taking up to max descriptors into fds; it returns their count in *nfds. */
static long recv_msg_fds(int s, void *buf, size_t len, int *fds, int max, int *nfds)
{
	struct iovec iov = { buf, len };
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf };
	long r;
	do r = raw6(SYS_recvmsg, s, (long)&mh, MSG_CMSG_CLOEXEC, 0, 0, 0); while (r == -EINTR);
	*nfds = 0;
	struct cmsghdr *c = r > 0 && mh.msg_controllen ? CMSG_FIRSTHDR(&mh) : NULL;
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
		int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int)), got[4];
		if (n > 4) n = 4;
		memcpy(got, CMSG_DATA(c), n * sizeof(int));
		for (int i = 0; i < n; i++) {
			if (*nfds < max) fds[(*nfds)++] = got[i];
			else raw6(SYS_close, got[i], 0, 0, 0, 0, 0);
		}
	}
	return r;
}

/* ---- the mapping filter (item 5) */

/* install_filter puts the filter on every thread of the process and returns its listener fd, or
 * -errno. With guard_forks it also hands the runtime every fork (fork, and clone without
 * CLONE_VM: a new mm; threads and vfork share this one), which it lets pass or refuses, and
 * fails clone3 with ENOSYS (its flags are in memory, out of a filter's sight; libcs then fall
 * back to clone, as they do under container runtimes' filters); and every execve and execveat,
 * which it lets pass, noting one made by a vfork child (posix_spawn's), whose new image no
 * control connection's end would tell it of. It needs CAP_SYS_ADMIN (farmem runs as root) or no_new_privs, which we do not set: it
 * would change what the program's own exec of a setuid binary does. */
static long install_filter(uint64_t min_bytes, int guard_forks)
{
	uint64_t ip = (uint64_t)fm_exempt_ip;
	enum { ARG_LO = 0, ARG_HI = 4 }; /* little-endian halves of an argument */
#define ARG(i, half) (offsetof(struct seccomp_data, args) + 8 * (i) + (half))
	struct sock_filter arch[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	/* Falls through to maps (below) for every call it does not decide. */
	struct sock_filter forks[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, FM_SYS_clone3, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execve, 5, 0),                 /* -> notify */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_execveat, 4, 0),               /* -> notify */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_fork, 3, 0),                   /* -> notify */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 3),                  /* -> maps */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(0, ARG_LO)),
		BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_VM, 1, 0),                   /* -> maps */
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
	};
	struct sock_filter maps[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_brk, 10, 0),                  /* -> ip check */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		/* mmap: private anonymous, not a thread stack, at least min_bytes long */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(3, ARG_LO)),
		BPF_STMT(BPF_ALU | BPF_AND | BPF_K, MAP_ANONYMOUS | MAP_SHARED | MAP_PRIVATE | MAP_STACK),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MAP_ANONYMOUS | MAP_PRIVATE, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(1, ARG_HI)),
		BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, 0, 2, 0),                          /* >= 4 GiB */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG(1, ARG_LO)),
		BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, (uint32_t)min_bytes, 0, 5),        /* short: allow */
		/* ip check: our own syscall instruction passes */
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)ip, 0, 2),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, instruction_pointer) + 4),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(ip >> 32), 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
#undef ARG
	struct sock_filter f[sizeof arch / sizeof arch[0] + sizeof forks / sizeof forks[0] + sizeof maps / sizeof maps[0]];
	unsigned short n = 0;
	memcpy(f + n, arch, sizeof arch), n += sizeof arch / sizeof arch[0];
	if (guard_forks) memcpy(f + n, forks, sizeof forks), n += sizeof forks / sizeof forks[0];
	memcpy(f + n, maps, sizeof maps), n += sizeof maps / sizeof maps[0];
	struct sock_fprog prog = { n, f };
	return exempt6(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
		       SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_TSYNC_ESRCH,
		       (long)&prog, 0, 0, 0);
}

/* ---- agent thread: executes eviction requests, installs the filter, performs notified calls */
static int agent_sock = -1;
/* drop_runs madvise(MADV_DONTNEED)s the runs of one eviction batch and returns the first errno (0
 * if all went well). Each run raises a REMOVE event, and its madvise waits until the runtime has
 * read it. One process_madvise over all the runs does those waits back to back and flushes the TLB
 * once for the batch, where a madvise per run flushes it per run, an IPI to every CPU the program
 * ran on each time (probes/dropbatch.c measures both; docs/DESIGN.md, "Evicting a page"). Linux
 * allows process_madvise(MADV_DONTNEED) on the caller itself since 6.13 (and PIDFD_SELF_THREAD,
 * no fd needed, since 6.15); on an older kernel the first batch finds out and every later one
 * uses the madvise loop. */
#define FM_PIDFD_SELF_THREAD (-10000)
enum { PM_UNKNOWN, PM_SELF, PM_PIDFD, PM_NONE };
static int drop_how = PM_UNKNOWN;
/* drop_pidfd: PM_PIDFD's pidfd of this process. A fork child must not inherit it (atfork_child
 * closes it): it names the parent, whose pages the child's drops would then discard. */
static long drop_pidfd = -1;
static void drop_runs(struct fm_run *runs, int n, int *err)
{
	int how = drop_how;
	long pidfd = drop_pidfd;
	struct iovec iov[MAX_RUNS];
	for (int i = 0; i < n; i++) iov[i].iov_base = (void *)runs[i].addr, iov[i].iov_len = runs[i].len;
	int i = 0;
	while (i < n && how != PM_NONE) {
		if (how == PM_PIDFD && pidfd < 0) pidfd = raw6(SYS_pidfd_open, raw6(SYS_getpid, 0, 0, 0, 0, 0, 0), 0, 0, 0, 0, 0);
		long fd = how == PM_PIDFD ? pidfd : FM_PIDFD_SELF_THREAD;
		long r = raw6(SYS_process_madvise, fd, (long)(iov + i), n - i, MADV_DONTNEED, 0, 0);
		if (r >= 0) {
			if (how == PM_UNKNOWN) how = PM_SELF;
			/* r is the bytes advised: skip the runs it covers (all of them, unless an error
			 * stopped it; the next call then reports that error). */
			for (; i < n && (size_t)r >= iov[i].iov_len; i++) r -= iov[i].iov_len;
			continue;
		}
		if (how == PM_UNKNOWN && r == -EBADF) { /* before 6.15: no PIDFD_SELF_THREAD */
			how = PM_PIDFD;
			continue;
		}
		if ((how == PM_UNKNOWN || how == PM_PIDFD) && i == 0 && (r == -EINVAL || r == -ENOSYS || r == -EPERM || (how == PM_PIDFD && pidfd < 0))) {
			how = PM_NONE; /* before 6.13 (or no pidfd): madvise each run below */
			break;
		}
		/* This run failed (the program unmapped it, say): note it and go on with the next. */
		if (!*err) *err = -r;
		i++;
	}
	drop_how = how;
	drop_pidfd = pidfd;
	for (; i < n; i++) {
		long r = raw6(SYS_madvise, runs[i].addr, runs[i].len, MADV_DONTNEED, 0, 0, 0);
		if (r < 0 && !*err) *err = -r;
	}
}

/* uffd_dev: a /dev/userfaultfd descriptor farmem sent (ask_uffd_dev), for a process that may
 * open neither the device nor a uffd handling kernel-mode faults by the system call: one running
 * as another user than root (vm.unprivileged_userfaultfd=0 leaves it UFFD_USER_MODE_ONLY, under
 * which a read(2) into an evicted page fails with EFAULT). The device checks permission only at
 * open (probes/uffdasuser.c). Kept for the image's life, close-on-exec: its fork probes' uffds,
 * and a fork child's, are made on it too. -1: none. */
static int uffd_dev = -1;

/* open_uffd returns a new userfaultfd (before its UFFDIO_API), or -errno. */
static int open_uffd(void)
{
	if (uffd_dev >= 0) return raw6(SYS_ioctl, uffd_dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK, 0, 0, 0);
	int dev = raw6(SYS_open, (long)"/dev/userfaultfd", O_RDWR | O_CLOEXEC, 0, 0, 0, 0);
	int fd = dev >= 0 ? raw6(SYS_ioctl, dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK, 0, 0, 0)
			  : raw6(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK, 0, 0, 0, 0, 0);
	if (dev >= 0) raw6(SYS_close, dev, 0, 0, 0, 0, 0);
	return fd;
}

/* register_on_own_uffd registers [addr, addr+len) with mode on a new uffd with no features, and
 * returns that uffd, or -errno (nothing left open). */
static long register_on_own_uffd(uint64_t addr, uint64_t len, uint64_t mode)
{
	int fd = open_uffd();
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register r = { .range = { addr, len }, .mode = mode };
	long e = fd < 0 ? fd : raw6(SYS_ioctl, fd, UFFDIO_API, (long)&api, 0, 0, 0);
	if (e >= 0) e = raw6(SYS_ioctl, fd, UFFDIO_REGISTER, (long)&r, 0, 0, 0);
	if (e < 0) {
		if (fd >= 0) raw6(SYS_close, fd, 0, 0, 0, 0, 0);
		return e;
	}
	return fd;
}

#define FM_PAGE 4096ULL

/* ctl: the process's control connection; ufd: its uffd. */
static int ctl = -1, ufd = -1;

/* The control page (pubtable's ctl* words), shared with farmem once the fault thread runs. */
struct fm_ctl { uint64_t lock, events_read, events_applied, room, post_head, post_tail, served, forwarded; };

/* spin_lock takes lock word w, which its holders hold across a system call or two at most. */
static void spin_lock(uint64_t *w)
{
	for (int i = 0;; i++) {
		uint64_t free = 0;
		if (__atomic_compare_exchange_n(w, &free, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
		if (i < 16) {
			__builtin_ia32_pause();
		} else if (i < 64) {
			raw6(SYS_sched_yield, 0, 0, 0, 0, 0, 0);
		} else {
			struct timespec ts = { 0, 20000 };
			raw6(SYS_nanosleep, (long)&ts, 0, 0, 0, 0, 0);
		}
	}
}

static void spin_unlock(uint64_t *w) { __atomic_store_n(w, 0, __ATOMIC_RELEASE); }

/* fault_lock takes the control page's lock, which farmem holds across one install at most. */
static void fault_lock(struct fm_ctl *c) { spin_lock(&c->lock); }
static void fault_unlock(struct fm_ctl *c) { spin_unlock(&c->lock); }

/* The staging area: where the agent moves a batch's victims (move_runs), for the runtime to read
 * and have dropped. UFFDIO_MOVE moves only into a range registered with the uffd it is issued on
 * (with the same protection as the source: MISSING|WP, as the runtime registers the program's
 * mappings), and the moves are issued on the program's own uffd, ufd: there the kernel fences
 * them with the program's layout changes, as it fences the runtime's installs (move_runs). Its
 * drop raises a REMOVE event, which the runtime's reader, or the fault thread, reads and passes
 * over (in_staging). Nothing ever faults in the area. A fork child's copy is registered on the
 * child's uffd, and holds the parent's staged pages for the child's table to read. */
static int fault_store = -1, fault_sock = -1; /* the fault thread's (below); a fork child closes its parent's */
static uint64_t stage_addr, stage_len; /* set once, before the first move; read by the fault thread */

/* The move fence: a page of farmem's, shared with the agent (its memfd comes with MSG_STAGING).
 * The runtime reads the program's uffd under its lock while it reads it itself, and counts the
 * layout events it read in layout; the fault thread, once it reads the uffd, does the same under
 * the control page's lock (events_read). See move_runs. */
struct fm_fence { uint64_t lock, layout; };
static struct fm_fence *fence;
static struct fm_ctl *fault_ctl; /* the fault thread's control page, once it runs (below) */

/* in_staging reports whether [start, end) is inside the staging area: a REMOVE event there is the
 * agent's own drop of it, no change to the program's layout. */
static int in_staging(uint64_t start, uint64_t end)
{
	uint64_t a = __atomic_load_n(&stage_addr, __ATOMIC_ACQUIRE);
	return a && start >= a && end <= a + stage_len;
}

static uint64_t make_staging(uint64_t bytes, int fence_fd, uint64_t *err)
{
	long f = exempt6(SYS_mmap, 0, FM_PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fence_fd, 0);
	if (f < 0 && f > -4096) { *err = -f; return 0; }
	/* A fork child has a fence of its own, if it ever moves: nothing of its parent's. */
	raw6(SYS_madvise, f, FM_PAGE, MADV_DONTFORK, 0, 0, 0);
	/* A mapping of its own, between two guard pages: registered as the program's mappings are,
	 * the area would otherwise be merged into a neighbouring one of the program's, which loses
	 * moved pages (docs/DESIGN.md, section 3, "Evicting a page"). */
	long g = exempt6(SYS_mmap, 0, bytes + 2 * FM_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	long a = g < 0 && g > -4096 ? g : exempt6(SYS_mmap, g + FM_PAGE, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	struct uffdio_register r = { .range = { (uint64_t)a, bytes }, .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
	long e = a < 0 && a > -4096 ? a : raw6(SYS_ioctl, ufd, UFFDIO_REGISTER, (long)&r, 0, 0, 0);
	if (e < 0) {
		*err = -e;
		if (!(g < 0 && g > -4096)) exempt6(SYS_munmap, g, bytes + 2 * FM_PAGE, 0, 0, 0, 0);
		exempt6(SYS_munmap, f, FM_PAGE, 0, 0, 0, 0);
		return 0;
	}
	fence = (struct fm_fence *)f;
	stage_len = bytes;
	__atomic_store_n(&stage_addr, (uint64_t)a, __ATOMIC_RELEASE);
	return (uint64_t)a;
}

/* move_lock keeps a fork from copying the program's memory while the agent moves pages out of
 * it. fork copies the address space one mapping after another: a page moved from a program
 * mapping not yet copied into a staging area already copied would be in neither of the child's
 * copies, and the child, whose page table says it was staged, would find it nowhere. The kernel
 * keeps that from happening by how it locks mappings (a mapping fork copied stays locked until
 * the copy is done, and a move that meets one waits: probes/forkmove.c); this lock keeps it from
 * happening whatever the kernel's locking. The shim's atfork prepare handler takes the lock and
 * its parent and child handlers release it; the agent holds it across each batch's moves, and
 * moves nothing while a fork holds it (try_lock_moves). A fork that the shim does not see (a
 * static program's, or a raw fork system call, whose children the runtime enters through the
 * mapping filter) is not held back by it; the runtime holds back the moves of a process whose
 * fork it serves (Process.forkGate). A three-state futex lock (0 free, 1 held, 2 held with
 * waiters): the agent has no libc. */
static int move_lock;

__attribute__((unused)) static void lock_moves(void) /* the shim's atfork handler; not the agent's */
{
	int c = 0;
	if (__atomic_compare_exchange_n(&move_lock, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) return;
	if (c != 2) c = __atomic_exchange_n(&move_lock, 2, __ATOMIC_ACQUIRE);
	while (c != 0) {
		raw6(SYS_futex, (long)&move_lock, FUTEX_WAIT_PRIVATE, 2, 0, 0, 0);
		c = __atomic_exchange_n(&move_lock, 2, __ATOMIC_ACQUIRE);
	}
}

/* try_lock_moves takes the lock only if it is free. The agent never waits for it: a forking thread
 * holds it from the prepare handler on, and may then fault on a page of the batch the agent is
 * moving, or wait at the cap for room that batch would make, until the batch ends. */
static int try_lock_moves(void)
{
	int c = 0;
	return __atomic_compare_exchange_n(&move_lock, &c, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static void unlock_moves(void)
{
	if (__atomic_exchange_n(&move_lock, 0, __ATOMIC_RELEASE) == 2)
		raw6(SYS_futex, (long)&move_lock, FUTEX_WAKE_PRIVATE, 1, 0, 0, 0);
}

/* UFFDIO_MOVE (Linux 6.8); our build headers may predate it. */
struct fm_uffdio_move { uint64_t dst, src, len, mode; int64_t move; };
#define FM_UFFDIO_MOVE 0xC028AA05UL /* _IOWR(UFFDIO, 0x05, struct uffdio_move) */
#define FM_UFFDIO_MOVE_MODE_DONTWAKE 1ULL

/* move_runs moves the pages of one eviction batch's runs out of the program into the staging
 * area, the batch's page k to dst + k pages, with UFFDIO_MOVE, and sets status[k] to 0, or to the
 * errno that kept page k where it is:
 *   ESTALE  the program's layout changed since the runtime chose the batch (below): page k's
 *           address may hold another page by now;
 *   EBUSY   still shared with a fork child (copy-on-write) or pinned: the kernel moves only a
 *           page this process alone maps, until the program writes it;
 *   ENOENT  absent: the program discarded it meanwhile;
 *   EAGAIN  an event not read yet (the program's madvise, munmap, mremap, fork) blocked the
 *           move until the budget of retries ran out;
 *   EINVAL  the run crosses two mappings (a move stays within one): tried page by page; a page
 *           that still fails is in a mapping the kernel will not move from (another protection,
 *           mlock);
 *   ENOTTY  a kernel before 6.8.
 *
 * The runtime chose the victims by address, from its page table as it was after the layout-th
 * layout event (layout). An address holds the page chosen only while no layout event came since:
 * a program that moves a range away and another over it (mremap) leaves another page there, which
 * a move would take for the victim. So each move is made under the locks of both readers of the
 * uffd, the runtime's (the fence's) and the fault thread's (its control page's), and only if
 * neither has read a layout event since. An event raised and not read yet the kernel fences: it
 * fails every move on the uffd (EAGAIN) from before it changes the layout until it is read,
 * which no reader can do while the move holds their locks. A move is never made while waiting
 * for such a read: the locks are let go between tries.
 *
 * A move stays in this process (probes/movecost.c measures it), where a drop costs a REMOVE
 * round trip with the runtime per run. The runtime evicts the pages that did not move the drop
 * way, so a page reported unmoved must still be in the program: see reconcile_moves. */
#define FENCE_PAGES 64 /* the most pages one move makes under the readers' locks */
static void move_runs(const struct fm_run *runs, int n, uint64_t dst, uint64_t layout, uint8_t *status, int pages)
{
	int budget = 200; /* EAGAIN retries for the whole batch: at most ~4 ms */
	int k = 0;        /* the batch index of run i's first page */
	struct fm_ctl *c = __atomic_load_n(&fault_ctl, __ATOMIC_ACQUIRE);
	for (int i = 0; i < n && k < pages; i++) {
		uint64_t len = runs[i].len, done = 0;
		if ((uint64_t)(pages - k) * FM_PAGE < len) len = (uint64_t)(pages - k) * FM_PAGE;
		int single = 0;
		while (done < len) {
			uint64_t want = single ? FM_PAGE : len - done;
			if (want > FENCE_PAGES * FM_PAGE) want = FENCE_PAGES * FM_PAGE;
			struct fm_uffdio_move mv = { .dst = dst + (uint64_t)k * FM_PAGE + done, .src = runs[i].addr + done,
						     .len = want, .mode = FM_UFFDIO_MOVE_MODE_DONTWAKE };
			spin_lock(&fence->lock);
			if (c) fault_lock(c);
			uint64_t read = __atomic_load_n(&fence->layout, __ATOMIC_ACQUIRE) + (c ? __atomic_load_n(&c->events_read, __ATOMIC_ACQUIRE) : 0);
			long r = read == layout ? raw6(SYS_ioctl, ufd, FM_UFFDIO_MOVE, (long)&mv, 0, 0, 0) : -ESTALE;
			if (c) fault_unlock(c);
			spin_unlock(&fence->lock);
			if (r == -ESTALE) {
				for (int p = k + (int)(done / FM_PAGE); p < pages; p++) status[p] = ESTALE;
				return;
			}
			uint64_t moved = r == 0 ? want : mv.move > 0 ? (uint64_t)mv.move : 0;
			for (uint64_t b = 0; b < moved; b += FM_PAGE) status[k + (done + b) / FM_PAGE] = 0;
			done += moved;
			if (r == 0 || moved > 0) continue; /* on to the rest, or to the page that stopped it */
			if (r == -EAGAIN && budget-- > 0) {
				struct timespec ts = { 0, 20000 };
				raw6(SYS_nanosleep, (long)&ts, 0, 0, 0, 0, 0);
				continue;
			}
			if (r == -EINVAL && !single && want > FM_PAGE) {
				single = 1;
				continue;
			}
			status[k + done / FM_PAGE] = -r > 255 ? 255 : (uint8_t)-r;
			done += FM_PAGE;
		}
		k += runs[i].len / FM_PAGE;
	}
}

/* reconcile_moves makes the statuses of a MOVE say what the staging area shows, not what the
 * ioctls returned: page k moved if and only if its staging page was absent before (before[k],
 * from mincore) and is present after. Two CI runs hung on pages the returns said stayed, which
 * were gone from the program: read there by the runtime, they fault for ever. A page that
 * moved is reported moved (0) whatever the ioctl said; one said moved but not there is EIO. */
static void reconcile_moves(uint64_t dst, uint8_t *status, int pages, const unsigned char *before)
{
	unsigned char after[MAX_MOVE_PAGES];
	if (raw6(SYS_mincore, dst, pages * FM_PAGE, (long)after, 0, 0, 0) < 0) return;
	for (int k = 0; k < pages; k++) {
		int moved = !(before[k] & 1) && (after[k] & 1);
		if (moved) status[k] = 0;
		else if (status[k] == 0) status[k] = EIO;
	}
}

/* ---- the process's handshake: its control connection, uffd and lifeline */
static uint64_t min_map = 1 << 20;
/* run_armed: the runtime's last HELLO_OK said the run is armed (registering mappings). */
static int run_armed;

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
/* A HELLO's c: 0 for a process farmem started or entered; for a fork child, FORK_CHILD, or'd with
 * the address of its fork probe (make_fork_probe), if it made one. */
#define FORK_CHILD 1ULL
/* Or'd into a HELLO's c: the uffd has had no UFFDIO_API; farmem makes it (new_uffd). */
#define API_LEFT 2ULL

static int hello(uint64_t fork_child, uint64_t features)
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
	run_armed = r.c & 1;
	if (fd >= 0) {
		raw6(SYS_close, ufd, 0, 0, 0, 0, 0);
		ufd = fd;
	}
	return 0;
}

/* ask_uffd_dev has farmem send a /dev/userfaultfd descriptor on the control connection and keeps
 * it in uffd_dev; 0, or -1. */
static int ask_uffd_dev(void)
{
	struct fm_msg m = { .type = MSG_UFFD_DEV, .version = PROTO_VERSION, .pid = raw6(SYS_getpid, 0, 0, 0, 0, 0, 0) };
	int fd = -1;
	if (ctl < 0 || send_msg(ctl, &m, sizeof m, -1) < 0) return -1;
	if (recv_msg(ctl, &m, sizeof m, &fd) != sizeof m || m.type != MSG_UFFD_DEV_OK || m.a || fd < 0) {
		if (fd >= 0) raw6(SYS_close, fd, 0, 0, 0, 0, 0);
		if (m.type == MSG_UFFD_DEV_OK && m.a == EPERM) say("farmem refused this process a userfaultfd: it is not one of the run's");
		return -1;
	}
	uffd_dev = fd;
	return 0;
}

/* new_uffd creates this process's userfaultfd with the features the runtime relies on, and says
 * in *api_left whether farmem must make its UFFDIO_API instead: EVENT_FORK needs CAP_SYS_PTRACE
 * of the task making that call, which a process running as another user has not, while farmem,
 * root, may make it on this uffd once it holds it (probes/uffdasuser.c). Without fork events a
 * fork child would read evicted pages as zeros. Such a process may not open /dev/userfaultfd
 * either: farmem sends it a descriptor of its own (ask_uffd_dev). */
static int new_uffd(uint64_t *features, int *api_left)
{
	int fd = open_uffd();
	if ((fd == -EACCES || fd == -EPERM) && ask_uffd_dev() == 0) fd = open_uffd();
	if (fd < 0) { say("cannot create a userfaultfd (need root or access to /dev/userfaultfd)"); return -1; }
	struct uffdio_api api = { .api = UFFD_API,
		.features = UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP |
			    UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	long r = raw6(SYS_ioctl, fd, UFFDIO_API, (long)&api, 0, 0, 0);
	*api_left = r == -EPERM;
	if (r < 0 && !*api_left) { say("UFFDIO_API refused the features farmem needs"); return -1; }
	*features = *api_left ? 0 : api.features;
	return fd;
}

static void close_fd(int *fd)
{
	if (*fd >= 0) raw6(SYS_close, *fd, 0, 0, 0, 0, 0);
	*fd = -1;
}

/* make_fork_probe maps a page this fork child alone holds and registers it on a uffd of its own,
 * for the runtime to tell which of its parent's FORK events is this child's: the events carry no
 * pid, and two threads of one process can fork at once, their children saying hello in either
 * order. The runtime asks each waiting event's uffd to register the page (the runtime's claimForkLocked):
 * the child's own finds it held by another uffd and answers EBUSY, while a sibling's finds
 * nothing there. The address comes from the pid, so that siblings born together, whose address
 * spaces are copies of one, put their probes in different places, far from where mappings are
 * made. Returns the page's address, or 0 if none could be made: the runtime then matches the
 * child in fork order. */
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#define FORK_PROBE_BASE 0x200000000000ULL /* 32 TiB: above heaps and ASan's shadow, below mmap's base */
#define FORK_PROBE_SLOTS (1ULL << 20)
static uint64_t make_fork_probe(int *probe_ufd)
{
	uint64_t pid = (uint64_t)raw6(SYS_getpid, 0, 0, 0, 0, 0, 0);
	long a = -1;
	for (uint64_t k = 0; k < 8 && a < 0; k++) {
		uint64_t want = FORK_PROBE_BASE + ((pid + k * 0x10001ULL) % FORK_PROBE_SLOTS) * FM_PAGE;
		a = exempt6(SYS_mmap, want, FM_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (a >= 0 && (uint64_t)a != want) { /* a kernel that took the flag for a hint */
			exempt6(SYS_munmap, a, FM_PAGE, 0, 0, 0, 0);
			return 0;
		}
	}
	if (a < 0) return 0;
	long fd = register_on_own_uffd((uint64_t)a, FM_PAGE, UFFDIO_REGISTER_MODE_MISSING);
	if (fd < 0) {
		exempt6(SYS_munmap, a, FM_PAGE, 0, 0, 0, 0);
		return 0;
	}
	*probe_ufd = (int)fd;
	return (uint64_t)a;
}

/* fork_child_hello gives a fork child its own connection, uffd and lifeline, dying if the
 * runtime cannot be reached. The descriptors it inherited are its parent's: the parent's agent
 * connection, uffd, lifeline (which signals the parent) and drop pidfd (which names the parent,
 * whose pages the child's drops would then discard) are closed, and the parent's fence and fault
 * thread's control page were not copied (MADV_DONTFORK). The parent's staging area was copied:
 * the runtime may read pages the parent had staged from it (its page table's Stage), so it
 * stays; this process moves nothing into it. */
static void fork_child_hello(const char *sock)
{
	close_fd(&ctl);
	close_fd(&agent_sock);
	close_fd(&ufd);
	close_fd(&lifeline);
	fence = 0;
	fault_ctl = 0;
	close_fd(&fault_store);
	close_fd(&fault_sock);
	if (drop_pidfd >= 0) raw6(SYS_close, drop_pidfd, 0, 0, 0, 0, 0);
	drop_pidfd = -1;
	uint64_t features = 0;
	int api_left = 0;
	ctl = connect_path(sock);
	ufd = new_uffd(&features, &api_left);
	int probe_ufd = -1;
	uint64_t probe = make_fork_probe(&probe_ufd);
	int ok = ctl >= 0 && ufd >= 0 && hello(FORK_CHILD | probe | (api_left ? API_LEFT : 0), features) == 0;
	if (probe) {
		close_fd(&probe_ufd); /* unregisters the page, so its unmap raises no event */
		exempt6(SYS_munmap, probe, FM_PAGE, 0, 0, 0, 0);
	}
	if (!ok) { say("fork child could not reach the farmem runtime"); die_runtime_lost(); }
}

/* detach_agent undoes what the agent holds in the process when farmem lets it go (farmem attach's
 * detach): the staging area (empty: no batch runs once farmem detaches; unregistered first, so
 * that its unmap raises no event farmem would have to read) and the fence, the drop
 * pidfd, the lifeline's read end (before farmem closes the write end, whose close would otherwise
 * kill the process), the process's copy of its uffd (farmem keeps its own until it has
 * unregistered every range), farmem's /dev/userfaultfd, if it was sent one, and the control
 * connection. */
static void detach_agent(void)
{
	if (stage_addr) {
		struct uffdio_range r = { stage_addr, stage_len };
		raw6(SYS_ioctl, ufd, UFFDIO_UNREGISTER, (long)&r, 0, 0, 0);
		exempt6(SYS_munmap, stage_addr - FM_PAGE, stage_len + 2 * FM_PAGE, 0, 0, 0, 0); /* and its guards */
	}
	stage_addr = 0;
	if (fence) exempt6(SYS_munmap, (long)fence, FM_PAGE, 0, 0, 0, 0);
	fence = 0;
	if (drop_pidfd >= 0) raw6(SYS_close, drop_pidfd, 0, 0, 0, 0, 0);
	drop_pidfd = -1;
	/* The lifeline's open file, not this descriptor, is set to signal: fork children that
	 * farmem has not entered yet hold copies of it, and its owner would be killed when farmem
	 * closes the write end. */
	if (lifeline >= 0) raw6(SYS_fcntl, lifeline, F_SETFL, O_NONBLOCK, 0, 0, 0);
	close_fd(&lifeline);
	close_fd(&ufd);
	close_fd(&uffd_dev);
	close_fd(&ctl);
}

/* ---- the fault thread: faults served in the program (docs/DESIGN.md, "Where a fault is served")
 *
 * On farmem's MSG_FAULTS the agent starts a second thread, which reads the program's uffd in
 * farmem's place. A missing fault on a page whose word (package pubtable) is Published, with room
 * left, it serves itself: it claims the word, reads the page from the process's store space
 * (pread: no mapping of the store, so no fault of its own on a page farmem wrote there since),
 * installs it with UFFDIO_COPY, and posts what it did for farmem to read (fetcher/inprogram.go).
 * Every other message goes to farmem on the socket, as the kernel gave it: the events first, in
 * their order, then the faults (a FORK event's new uffd goes along, and the thread closes its
 * copy). It serves nothing while an event it read is not applied by farmem (the control page's
 * counts), and holds the control page's lock across each read of the uffd, which farmem holds
 * across each install of its own: fetcher/inprogram.go says why.
 *
 * Once it reads the uffd the thread touches no memory of the program's that could be evicted:
 * the uffd is read by no one while it waits on such a page. Its stack (a shared mapping, which
 * farmem never registers) holds its state and the page it copies from; the table, the control
 * page and the posts are the memfd farmem sent. */
#define FM_TABLE_LIMIT (1ULL << 47)        /* pubtable.Limit */
#define FM_TABLE_BYTES ((FM_TABLE_LIMIT >> 12) * 8)
#define FM_POSTS 4096                      /* pubtable.Posts */
#define FM_TABLE_FILE (FM_TABLE_BYTES + 4096 + FM_POSTS * sizeof(struct fm_post))
#define FM_FAULT_STACK (64 << 10)
enum { W_NONE, W_PUBLISHED, W_CLEAN, W_FARMEM, W_CLAIMED };
#define W_KIND 7ULL
#define W_GUESS_WRITABLE 8ULL /* pubtable.GuessWritable */
#define W_OFFSET (~4095ULL)
struct fm_post { uint64_t page_dirt, word, tid, unused; }; /* tid: the thread whose fault it was */
#define FM_TREND 8
struct fault_ctx {
	int ufd, sock, store;
	uint64_t *words;
	struct fm_ctl *ctl;
	struct fm_post *posts;
	/* The last fault's page and the last FM_TREND strides between faults (trend). */
	uint64_t last;
	int64_t strides[FM_TREND];
	unsigned nstrides;
};
static struct fault_ctx fault_start; /* the fault thread's, copied to its stack as it starts */
static long clone_thread(uint64_t stack_top, void (*fn)(void));


/* forward sends farmem message m, with descriptor fd if it is not negative. */
static void forward(struct fault_ctx *c, const struct uffd_msg *m, int fd)
{
	if (send_msg(c->sock, m, sizeof *m, fd) < 0) die_runtime_lost();
}

/* trend notes the fault at page and reports whether it continues a trend: its stride from the
 * last fault is one of the last FM_TREND strides (a scan, a stride, two interleaved scans). Such
 * faults go to farmem, whose prefetcher (Leap's majority trend) brings the pages that follow in
 * before they are touched, which only pays where it sees the faults; the others, with no trend a
 * prefetch could follow, are served here. */
static int trend(struct fault_ctx *c, uint64_t page)
{
	int64_t stride = (int64_t)(page - c->last) / (int64_t)FM_PAGE;
	int seen = 0;
	for (unsigned i = 0; i < FM_TREND && i < c->nstrides; i++) seen += c->strides[i] == stride;
	c->strides[c->nstrides++ % FM_TREND] = stride;
	c->last = page;
	return seen > 0 && stride != 0;
}

/* serve_fault serves page fault m if its page's word lets the agent: 1 if it did, else 0 (the
 * caller sends it to farmem). page is the thread's buffer. */
static int serve_fault(struct fault_ctx *c, const struct uffd_msg *m, char *page)
{
	uint64_t flags = m->arg.pagefault.flags, addr = m->arg.pagefault.address & W_OFFSET;
	if (flags & UFFD_PAGEFAULT_FLAG_WP) return 0;
	if (addr == 0 || addr >= FM_TABLE_LIMIT || __atomic_load_n(&c->words[0], __ATOMIC_ACQUIRE)) return 0;
	if (__atomic_load_n(&c->ctl->events_read, __ATOMIC_ACQUIRE) != __atomic_load_n(&c->ctl->events_applied, __ATOMIC_ACQUIRE))
		return 0;
	if (c->ctl->post_tail - __atomic_load_n(&c->ctl->post_head, __ATOMIC_ACQUIRE) >= FM_POSTS) return 0;
	uint64_t *wp = &c->words[addr >> 12];
	uint64_t w = __atomic_load_n(wp, __ATOMIC_ACQUIRE);
	if ((w & W_KIND) != W_PUBLISHED) return 0;
	uint64_t room = __atomic_load_n(&c->ctl->room, __ATOMIC_ACQUIRE);
	do {
		if (room == 0) {
			/* farmem serves it: the word is farmem's from now on. */
			__atomic_compare_exchange_n(wp, &w, W_FARMEM, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
			return 0;
		}
	} while (!__atomic_compare_exchange_n(&c->ctl->room, &room, room - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
	if (!__atomic_compare_exchange_n(wp, &w, W_CLAIMED, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
		__atomic_add_fetch(&c->ctl->room, 1, __ATOMIC_RELEASE);
		return 0;
	}
	long got = raw6(SYS_pread64, c->store, (long)page, FM_PAGE, (long)(w & W_OFFSET), 0, 0);
	uint64_t dirt = (flags & UFFD_PAGEFAULT_FLAG_WRITE) ? 1 : (w & W_GUESS_WRITABLE) ? 2 : 0;
	if (got == (long)FM_PAGE) {
		struct uffdio_copy cp = { .dst = addr, .src = (uint64_t)page, .len = FM_PAGE,
					  .mode = dirt ? 0 : UFFDIO_COPY_MODE_WP };
		long r = raw6(SYS_ioctl, c->ufd, UFFDIO_COPY, (long)&cp, 0, 0, 0);
		if (r == 0 && cp.copy == (int64_t)FM_PAGE) {
			uint64_t t = c->ctl->post_tail;
			c->posts[t % FM_POSTS] = (struct fm_post){ addr | dirt, w, m->arg.pagefault.feat.ptid, 0 };
			__atomic_store_n(&c->ctl->post_tail, t + 1, __ATOMIC_RELEASE);
			__atomic_add_fetch(&c->ctl->served, 1, __ATOMIC_RELAXED);
			return 1;
		}
	}
	/* Not installed (an event not read yet, the page there already...): farmem sees to it, and
	 * the word is as farmem left it. */
	__atomic_store_n(wp, w, __ATOMIC_RELEASE);
	__atomic_add_fetch(&c->ctl->room, 1, __ATOMIC_RELEASE);
	return 0;
}

/* staging_remove reports whether m is the REMOVE event of the agent's drop of the staging area:
 * the fault thread neither counts nor forwards those (farmem's reader passes over them too). */
static int staging_remove(const struct uffd_msg *m)
{
	return m->event == UFFD_EVENT_REMOVE && in_staging(m->arg.remove.start, m->arg.remove.end);
}

__attribute__((noreturn)) static void fault_thread(void)
{
	struct fault_ctx c = fault_start;
	char go = 0, page[FM_PAGE] __attribute__((aligned(64)));
	long r;
	do r = raw6(SYS_read, c.sock, (long)&go, 1, 0, 0, 0); while (r == -EINTR);
	if (r != 1 || go != 'g') for (;;) raw6(SYS_exit, 0, 0, 0, 0, 0, 0); /* farmem went on without it */
	struct uffd_msg msgs[16];
	struct pollfd { int fd; short events, revents; } pfd[2] = { { c.ufd, 1, 0 }, { c.sock, 1, 0 } }; /* POLLIN */
	for (;;) {
		/* Read first, poll only when nothing is queued: the install that served the last
		 * fault woke its thread, which on this CPU ran until its next fault, usually queued
		 * by now (fetcher's serve reads the same way). */
		fault_lock(c.ctl);
		r = raw6(SYS_read, c.ufd, (long)msgs, sizeof msgs, 0, 0, 0);
		uint64_t events = 0;
		for (long i = 0; r > 0 && i < r / (long)sizeof msgs[0]; i++) events += msgs[i].event != UFFD_EVENT_PAGEFAULT && !staging_remove(&msgs[i]);
		if (events) __atomic_add_fetch(&c.ctl->events_read, events, __ATOMIC_RELEASE);
		fault_unlock(c.ctl);
		if (r == -EAGAIN || r == -EINTR) {
			pfd[0].revents = pfd[1].revents = 0;
			if (raw6(SYS_poll, (long)pfd, 2, -1, 0, 0, 0) > 0 && pfd[1].revents) {
				/* farmem says nothing on the socket: it closed it, or died. */
				say("the farmem runtime closed the fault socket");
				die_runtime_lost();
			}
			continue;
		}
		if (r <= 0) {
			say("reading the userfaultfd failed");
			die_runtime_lost();
		}
		long n = r / (long)sizeof msgs[0];
		for (long i = 0; i < n; i++) {
			if (msgs[i].event == UFFD_EVENT_PAGEFAULT || staging_remove(&msgs[i])) continue;
			int fd = msgs[i].event == UFFD_EVENT_FORK ? (int)msgs[i].arg.fork.ufd : -1;
			forward(&c, &msgs[i], fd);
			if (fd >= 0) raw6(SYS_close, fd, 0, 0, 0, 0, 0);
		}
		for (long i = 0; i < n; i++) {
			if (msgs[i].event != UFFD_EVENT_PAGEFAULT) continue;
			if (!trend(&c, msgs[i].arg.pagefault.address & W_OFFSET) && serve_fault(&c, &msgs[i], page)) continue;
			__atomic_add_fetch(&c.ctl->forwarded, 1, __ATOMIC_RELAXED);
			forward(&c, &msgs[i], -1);
		}
	}
}

/* start_fault_thread maps the table farmem sent (table, closed here) and starts the fault thread
 * on the store space store and the socket sock, which it keeps; its id, or -errno. */
static long start_fault_thread(int table, int store, int sock)
{
	long words = exempt6(SYS_mmap, 0, FM_TABLE_FILE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, table, 0);
	raw6(SYS_close, table, 0, 0, 0, 0, 0);
	if (words < 0 && words > -4096) return words;
	long stack = exempt6(SYS_mmap, 0, FM_FAULT_STACK, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (stack < 0 && stack > -4096) {
		exempt6(SYS_munmap, words, FM_TABLE_FILE, 0, 0, 0, 0);
		return stack;
	}
	/* The thread reads the uffd under the control page's lock: a read must never wait there. */
	long fl = raw6(SYS_fcntl, ufd, F_GETFL, 0, 0, 0, 0);
	if (fl >= 0 && !(fl & O_NONBLOCK)) raw6(SYS_fcntl, ufd, F_SETFL, fl | O_NONBLOCK, 0, 0, 0);
	/* A fork child has a table and a thread of its own, if any: nothing of its parent's. */
	raw6(SYS_madvise, words, FM_TABLE_FILE, MADV_DONTFORK, 0, 0, 0);
	raw6(SYS_madvise, stack, FM_FAULT_STACK, MADV_DONTFORK, 0, 0, 0);
	fault_store = store, fault_sock = sock;
	fault_start = (struct fault_ctx){ .ufd = ufd, .sock = sock, .store = store, .words = (uint64_t *)words,
					  .ctl = (struct fm_ctl *)(words + FM_TABLE_BYTES),
					  .posts = (struct fm_post *)(words + FM_TABLE_BYTES + 4096) };
	long tid = clone_thread(stack + FM_FAULT_STACK, fault_thread);
	if (tid >= 0) __atomic_store_n(&fault_ctl, fault_start.ctl, __ATOMIC_RELEASE);
	if (tid < 0) {
		exempt6(SYS_munmap, words, FM_TABLE_FILE, 0, 0, 0, 0);
		exempt6(SYS_munmap, stack, FM_FAULT_STACK, 0, 0, 0, 0);
		fault_store = fault_sock = -1;
	}
	return tid;
}

/* agent_serve runs the agent thread's work on agent_sock, for ever: it says AGENT_HELLO (the
 * thread's id, and the memory it works from, [mem, mem+mem_len), which the runtime must never
 * evict: its stack), then executes the runtime's requests. The caller has blocked every signal:
 * the program's handlers must not run on this thread. */
static void agent_serve(uint64_t mem, uint64_t mem_len)
{
	/* Everything the agent touches while it moves pages is on its stack, which the runtime never
	 * evicts (AGENT_HELLO's b, c). Not in TLS: glibc keeps that above the stack, where pages can be
	 * victims, and a page the agent moves out of its own reach would wait for the batch the agent
	 * is executing. */
	char buf[sizeof(struct fm_msg) + MAX_RUNS * sizeof(struct fm_run)] __attribute__((aligned(8)));
	/* The runtime exempts this thread's own faults from cap throttling: eviction needs it. */
	struct fm_msg h = { .type = MSG_AGENT_HELLO, .version = PROTO_VERSION, .pid = raw6(SYS_getpid, 0, 0, 0, 0, 0, 0),
			    .a = raw6(SYS_gettid, 0, 0, 0, 0, 0, 0), .b = mem, .c = mem_len };
	if (send_msg(agent_sock, &h, sizeof h, -1) < 0) die_runtime_lost();
	for (;;) {
		int fds[3], nfds;
		long n = recv_msg_fds(agent_sock, buf, sizeof buf, fds, 3, &nfds);
		if (n <= 0) die_runtime_lost();
		struct fm_msg *m = (struct fm_msg *)buf;
		if (m->type == MSG_FAULTS && n >= (long)sizeof *m) {
			struct fm_msg done = { .type = MSG_FAULTS_OK, .version = PROTO_VERSION };
			long tid = nfds == 3 ? start_fault_thread(fds[0], fds[1], fds[2]) : -EINVAL;
			if (tid < 0) {
				for (int i = tid == -EINVAL ? 0 : 1; i < nfds; i++) raw6(SYS_close, fds[i], 0, 0, 0, 0, 0);
				done.a = -tid;
			} else {
				done.b = tid;
			}
			if (send_msg(agent_sock, &done, sizeof done, -1) < 0) die_runtime_lost();
			continue;
		}
		if (m->type == MSG_STAGING && n >= (long)sizeof *m) {
			struct fm_msg done = { .type = MSG_STAGING_OK, .version = PROTO_VERSION };
			if (nfds != 1) done.b = EINVAL;
			else if (stage_addr) done.b = EEXIST;
			else done.a = make_staging(m->a, fds[0], &done.b);
			for (int i = 0; i < nfds; i++) raw6(SYS_close, fds[i], 0, 0, 0, 0, 0);
			if (send_msg(agent_sock, &done, sizeof done, -1) < 0) die_runtime_lost();
			continue;
		}
		for (int i = 0; i < nfds; i++) raw6(SYS_close, fds[i], 0, 0, 0, 0, 0);
		if (n < (long)sizeof *m) continue;
		if (m->type == MSG_SYSCALL && n >= (long)(sizeof *m + 6 * sizeof(uint64_t))) {
			uint64_t *a = (uint64_t *)(buf + sizeof *m);
			struct fm_msg done = { .type = MSG_SYSCALL_DONE, .version = PROTO_VERSION,
					       .a = exempt6(m->a, a[0], a[1], a[2], a[3], a[4], a[5]) };
			if (send_msg(agent_sock, &done, sizeof done, -1) < 0) die_runtime_lost();
			continue;
		}
		if (m->type == MSG_DETACH) {
			detach_agent();
			struct fm_msg done = { .type = MSG_DETACH_OK, .version = PROTO_VERSION };
			send_msg(agent_sock, &done, sizeof done, -1);
			close_fd(&agent_sock);
			/* The thread's stack is in farmem's memory, which farmem unmaps once the thread
			 * is gone: nothing of it is touched after this call. */
			for (;;) raw6(SYS_exit, 0, 0, 0, 0, 0, 0);
		}
		if (m->type == MSG_AGENT_READY) {
			fm_agent_ready();
			continue;
		}
		if (m->type == MSG_FILTER) {
			long fd = install_filter(m->a, m->b & 1);
			struct fm_msg done = { .type = MSG_FILTER_OK, .version = PROTO_VERSION, .a = fd < 0 ? -fd : 0 };
			if (send_msg(agent_sock, &done, sizeof done, fd < 0 ? -1 : fd) < 0) die_runtime_lost();
			if (fd >= 0) raw6(SYS_close, fd, 0, 0, 0, 0, 0);
			continue;
		}
		struct fm_run *runs = (struct fm_run *)(buf + sizeof *m);
		int nruns = m->n < MAX_RUNS ? m->n : MAX_RUNS;
		if ((long)(sizeof *m + nruns * sizeof *runs) > n) nruns = (n - sizeof *m) / sizeof *runs;
		if (m->type == MSG_MOVE) {
			char out[sizeof(struct fm_msg) + MAX_MOVE_PAGES] __attribute__((aligned(8)));
			int pages = m->b < MAX_MOVE_PAGES ? (int)m->b : MAX_MOVE_PAGES;
			struct fm_msg *d = (struct fm_msg *)out;
			*d = (struct fm_msg){ .type = MSG_MOVE_DONE, .version = PROTO_VERSION, .n = pages };
			uint8_t *st = (uint8_t *)(out + sizeof *d);
			for (int k = 0; k < pages; k++) st[k] = ECANCELED; /* past the runs: never asked */
			unsigned char before[MAX_MOVE_PAGES];
			if (!fence) {
				for (int k = 0; k < pages; k++) st[k] = ENXIO; /* no staging area */
			} else if (try_lock_moves()) {
				long mc = raw6(SYS_mincore, m->a, pages * FM_PAGE, (long)before, 0, 0, 0);
				move_runs(runs, nruns, m->a, m->c, st, pages);
				unlock_moves();
				if (mc == 0) reconcile_moves(m->a, st, pages, before);
			} else {
				/* A fork is under way: nothing moves, and the runtime drops the batch's
				 * pages instead, which a fork cannot split (the drop takes the mmap lock). */
				for (int k = 0; k < pages; k++) st[k] = EAGAIN;
			}
			if (send_msg(agent_sock, out, sizeof *d + pages, -1) < 0) die_runtime_lost();
			continue;
		}
		if (m->type != MSG_EVICT) continue;
		int err = 0;
		drop_runs(runs, nruns, &err);
		struct fm_msg done = { .type = MSG_EVICT_DONE, .version = PROTO_VERSION, .n = m->n, .a = err };
		if (send_msg(agent_sock, &done, sizeof done, -1) < 0) die_runtime_lost();
	}
}

/* clone_thread starts fn on the stack whose top is stack_top, as a thread of this process with
 * every signal blocked from its first instruction, and returns its id, or -errno. It is how an
 * agent thread starts where pthread_create cannot be called: in the injected agent, which has no
 * libc (agent.c), and in the child of glibc's _Fork(), where only async-signal-safe calls may be
 * made (shim.c). The thread has no TLS of its own (it runs on the caller's thread pointer, which
 * agent_serve never reads) and no libc state: fn never returns, and ends the thread with exit. The
 * calling thread's signal mask is put back after. */
__attribute__((visibility("hidden"))) long clone_thread_asm(long flags, uint64_t stack, void (*fn)(void));
__asm__(".text\n"
	".hidden clone_thread_asm\n"
	"clone_thread_asm:\n"
	"	mov %rdx, %r9\n"              /* fn: clone leaves r9 alone in both threads */
	"	mov $56, %eax\n"              /* SYS_clone: flags in rdi, stack in rsi */
	"	xor %edx, %edx\n"
	"	xor %r10d, %r10d\n"
	"	xor %r8d, %r8d\n"
	"	syscall\n"
	"	test %rax, %rax\n"
	"	jnz 1f\n"
	"	xor %ebp, %ebp\n"             /* the new thread, on its own stack */
	"	and $-16, %rsp\n"
	"	call *%r9\n"
	"	ud2\n"
	"1:	ret\n");

__attribute__((unused)) static long clone_thread(uint64_t stack_top, void (*fn)(void))
{
	uint64_t all = ~0ULL, old = 0;
	raw6(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, (long)&old, sizeof all, 0, 0);
	long tid = clone_thread_asm(CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD | CLONE_SYSVSEM,
				    stack_top, fn);
	raw6(SYS_rt_sigprocmask, SIG_SETMASK, (long)&old, 0, sizeof old, 0, 0);
	return tid;
}
#endif
