/* rawclone: fills MIB MiB with data it can verify, forks with a raw clone(SIGCHLD) system call (no
 * atfork handler runs, in the parent or the child), or with glibc's _Fork() when the fourth
 * argument is _Fork (no handler runs either), and prints "forked PID". The child waits SECONDS,
 * verifies every page, and writes "child ok" or "child BAD N" (N pages wrong) to OUT; the parent
 * waits for it and exits with its status, or, when the fourth argument is orphan, exits at once,
 * by the system call, before anything else (a raw clone's child outliving its parent, as a
 * daemon's does; the child says "forked PID" then). With cloneparent the clone is
 * made with CLONE_PARENT (the child is its parent's sibling: a child of its parent's parent),
 * and the parent exits a second later, leaving the child to its grandparent meanwhile.
 * usage: rawclone MIB SECONDS OUT [_Fork|orphan|cloneparent] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t word(size_t i) { return i * 0x9e3779b97f4a7c15ULL + 1; }

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: rawclone MIB SECONDS OUT [_Fork|orphan|cloneparent]\n");
		return 2;
	}
	size_t n = strtoul(argv[1], 0, 10) << 20;
	uint64_t *b = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b == MAP_FAILED) return 2;
	for (size_t i = 0; i < n / 8; i += 512) b[i] = word(i);
	const char *mode = argc > 4 ? argv[4] : "";
	long pid = !strcmp(mode, "_Fork")	? _Fork()
		   : !strcmp(mode, "cloneparent") ? syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0)
						  : syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
	if (pid > 0 && !strcmp(mode, "orphan")) syscall(SYS_exit_group, 0);
	if (pid == 0) {
		/* Raw system calls only: the child's libc state is its parent's thread's. */
		if (!strcmp(mode, "orphan")) {
			char said[32];
			int n = snprintf(said, sizeof said, "forked %ld\n", syscall(SYS_getpid));
			syscall(SYS_write, 1, said, n);
		}
		struct timespec ts = { atoi(argv[2]), 0 };
		syscall(SYS_nanosleep, &ts, 0);
		long bad = 0;
		for (size_t i = 0; i < n / 8; i += 512) bad += b[i] != word(i);
		char msg[64];
		int len = bad ? snprintf(msg, sizeof msg, "child BAD %ld\n", bad) : snprintf(msg, sizeof msg, "child ok\n");
		int fd = syscall(SYS_open, argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
		syscall(SYS_write, fd, msg, len);
		syscall(SYS_exit_group, bad ? 1 : 0);
	}
	if (pid < 0) return 2;
	printf("forked %ld\n", pid);
	fflush(stdout);
	if (!strcmp(mode, "cloneparent")) {
		sleep(1);
		return 0;
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return 2;
	return WEXITSTATUS(st);
}
