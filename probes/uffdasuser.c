/* uffdasuser: what a process running as an unprivileged user (uid 65534, no capabilities) can have
 * of userfaultfd and seccomp when a root process does the privileged steps for it, as farmem does
 * for a program that switched users (launcher/shim/agent.h, new_uffd; runtime/hello.go).
 *
 * The root parent forks a child that drops to uid/gid 65534. The child checks what it may not do
 * itself (open /dev/userfaultfd; userfaultfd(2) without UFFD_USER_MODE_ONLY; handle a kernel-mode
 * fault on a user-mode-only uffd; UFFDIO_API with EVENT_FORK; install a seccomp filter without
 * no_new_privs), then makes its uffd with USERFAULTFD_IOC_NEW on a /dev/userfaultfd descriptor the
 * parent opened and sent it, and sends that uffd back without its UFFDIO_API. The parent makes the
 * API call with EVENT_FORK, registers the child's buffer and serves its faults (and, through the
 * FORK event, its fork child's). The child then has read(2) write into an absent page (a kernel-mode
 * fault), reads a page from user mode, and forks a child that reads a page still absent.
 *
 *   cc -O2 -o uffdasuser probes/uffdasuser.c -lpthread && ./uffdasuser   # as root
 *
 * Each line is "name: what happened (expected)"; the exit status is 0 when all were as expected.
 * On 2026-11-26 (PVM guest, Linux 6.18, vm.unprivileged_userfaultfd=0, /dev/userfaultfd 0600):
 * all as expected: the child may not open the device (EACCES) nor make a uffd by the system call
 * (EPERM); a user-mode-only uffd fails a read(2) into a registered page (EFAULT); UFFDIO_API
 * with EVENT_FORK is EPERM in the child and succeeds, on the same uffd after that refusal, from
 * root; the uffd made on root's device descriptor then serves the kernel-mode fault, and the fork
 * child's page arrives through the FORK event's uffd; the seccomp filter is EACCES. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096
#define PAGES 16
static int bad;

static void check(const char *name, int ok, const char *what)
{
	printf("%s: %s (%s)\n", name, what, ok ? "as expected" : "NOT as expected");
	fflush(stdout);
	if (!ok) bad = 1;
}

static void send_fd(int s, int fd, uint64_t word)
{
	char cb[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { &word, sizeof word };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (fd >= 0) {
		mh.msg_control = cb, mh.msg_controllen = sizeof cb;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET, c->cmsg_type = SCM_RIGHTS, c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	if (sendmsg(s, &mh, 0) < 0) perror("sendmsg"), exit(2);
}

static int recv_fd(int s, uint64_t *word)
{
	char cb[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { word, sizeof *word };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb, .msg_controllen = sizeof cb };
	if (recvmsg(s, &mh, 0) <= 0) perror("recvmsg"), exit(2);
	struct cmsghdr *c = mh.msg_controllen ? CMSG_FIRSTHDR(&mh) : NULL;
	int fd = -1;
	if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}

/* The parent's fault server: every uffd it knows, a page of (page index + 1) for each fault. */
static int fds[8], nfds;
static uint64_t base;
static void *serve(void *arg)
{
	(void)arg;
	static char page[PG];
	for (;;) {
		struct pollfd p[8];
		for (int i = 0; i < nfds; i++) p[i] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
		if (poll(p, nfds, -1) < 0) continue;
		for (int i = 0; i < nfds; i++) {
			if (!(p[i].revents & POLLIN)) continue;
			struct uffd_msg m;
			if (read(fds[i], &m, sizeof m) != sizeof m) continue;
			if (m.event == UFFD_EVENT_FORK) {
				fds[nfds++] = m.arg.fork.ufd;
			} else if (m.event == UFFD_EVENT_PAGEFAULT) {
				uint64_t a = m.arg.pagefault.address & ~(uint64_t)(PG - 1);
				memset(page, (int)((a - base) / PG + 1), PG);
				struct uffdio_copy c = { .dst = a, .src = (uint64_t)page, .len = PG };
				ioctl(fds[i], UFFDIO_COPY, &c);
			}
		}
	}
	return NULL;
}

static void child(int s)
{
	if (setgroups(0, NULL) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)) perror("drop"), exit(2);
	int fd = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	check("open /dev/userfaultfd as 65534", fd < 0 && errno == EACCES, fd < 0 ? strerror(errno) : "opened");
	fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	check("userfaultfd(2) as 65534", fd < 0 && errno == EPERM, fd < 0 ? strerror(errno) : "made");

	/* A user-mode-only uffd: a kernel-mode fault (read(2) into the page) is not handed to it. */
	char *m0 = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	fd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	struct uffdio_api api0 = { .api = UFFD_API };
	struct uffdio_register r0 = { .range = { (uint64_t)m0, PG }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (fd < 0 || ioctl(fd, UFFDIO_API, &api0) || ioctl(fd, UFFDIO_REGISTER, &r0)) perror("user-mode-only uffd"), exit(2);
	int pp[2];
	if (pipe(pp)) exit(2);
	char msg[PG];
	memset(msg, 'x', PG);
	if (write(pp[1], msg, PG) != PG) exit(2);
	ssize_t n = read(pp[0], m0, PG);
	check("read(2) into a page of a user-mode-only uffd", n < 0 && errno == EFAULT, n < 0 ? strerror(errno) : "read");
	close(fd);

	struct sock_filter allow[] = { BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW) };
	struct sock_fprog prog = { 1, allow };
	long sr = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
	check("seccomp filter as 65534 without no_new_privs", sr < 0 && errno == EACCES, sr < 0 ? strerror(errno) : "installed");

	/* The device descriptor root opened. */
	uint64_t w;
	int dev = recv_fd(s, &w);
	int u = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
	check("USERFAULTFD_IOC_NEW on root's /dev/userfaultfd descriptor", u >= 0, u < 0 ? strerror(errno) : "made");
	if (u < 0) exit(1);
	struct uffdio_api api = { .api = UFFD_API, .features = UFFD_FEATURE_EVENT_FORK };
	long ar = ioctl(u, UFFDIO_API, &api);
	check("UFFDIO_API with EVENT_FORK as 65534", ar < 0 && errno == EPERM, ar < 0 ? strerror(errno) : "granted");
	char *buf = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	send_fd(s, u, (uint64_t)buf);
	int ok = -1;
	recv_fd(s, &w); /* the parent registered buf */
	if (w) exit(1);

	if (write(pp[1], msg, PG) != PG) exit(2);
	n = read(pp[0], buf, PG);
	check("read(2) into an absent page, served by root", n == PG && buf[0] == 'x' && buf[PG - 1] == 'x',
	      n < 0 ? strerror(errno) : "read");
	check("a user-mode read of an absent page", buf[PG] == 2, buf[PG] == 2 ? "the served page" : "something else");
	pid_t k = fork();
	if (k == 0) _exit(buf[2 * PG] == 3 && buf[2 * PG + PG - 1] == 3 ? 0 : 1);
	int st;
	waitpid(k, &st, 0);
	ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
	check("the fork child's read of a page absent at the fork", ok, ok ? "served through the FORK event" : "not the page");
	exit(bad);
}

int main(void)
{
	if (geteuid() != 0) { fprintf(stderr, "run as root\n"); return 2; }
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp)) return 2;
	pid_t c = fork();
	if (c == 0) {
		close(sp[0]);
		child(sp[1]);
	}
	close(sp[1]);
	int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev < 0) { perror("/dev/userfaultfd"); return 2; }
	send_fd(sp[0], dev, 0);
	uint64_t addr;
	int u = recv_fd(sp[0], &addr);
	struct uffdio_api api = { .api = UFFD_API,
		.features = UFFD_FEATURE_EVENT_FORK | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_UNMAP |
			    UFFD_FEATURE_EVENT_REMAP | UFFD_FEATURE_THREAD_ID | UFFD_FEATURE_PAGEFAULT_FLAG_WP };
	long ar = ioctl(u, UFFDIO_API, &api);
	check("root's UFFDIO_API with EVENT_FORK on the child's uffd", ar == 0, ar < 0 ? strerror(errno) : "granted");
	struct uffdio_register r = { .range = { addr, PAGES * PG }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	long rr = ar == 0 ? ioctl(u, UFFDIO_REGISTER, &r) : -1;
	check("root registers the child's buffer", rr == 0, rr < 0 ? strerror(errno) : "registered");
	base = addr;
	fds[nfds++] = u;
	pthread_t t;
	pthread_create(&t, NULL, serve, NULL);
	send_fd(sp[0], -1, rr == 0 ? 0 : 1);
	int st;
	waitpid(c, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
	printf("%s\n", bad ? "FAIL" : "all as expected");
	return bad;
}
