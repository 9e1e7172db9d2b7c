/* tracedexec is a tracer, as a debugger or strace is, for the exec tests (cmd/farmem/execed_test.go):
 * it forks, and its child, traced from its start (PTRACE_TRACEME), execs PROGRAM; it passes on
 * every signal that stops the child, and exits with the child's status. farmem cannot enter an
 * image a process it does not trace is already tracing (a process has one tracer).
 *
 *	tracedexec PROGRAM [ARGS...] */
#include <signal.h>
#include <stdio.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: tracedexec PROGRAM [ARGS...]\n");
		return 2;
	}
	pid_t c = fork();
	if (c < 0) {
		perror("fork");
		return 1;
	}
	if (c == 0) {
		ptrace(PTRACE_TRACEME, 0, 0, 0);
		execv(argv[1], argv + 1);
		perror("execv");
		_exit(127);
	}
	int st, execed = 0;
	for (;;) {
		if (waitpid(c, &st, 0) < 0) {
			perror("waitpid");
			return 1;
		}
		if (WIFEXITED(st)) return WEXITSTATUS(st);
		if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
		int sig = WSTOPSIG(st);
		if (sig == SIGTRAP && !execed) sig = 0, execed = 1; /* the exec's own stop */
		ptrace(PTRACE_CONT, c, 0, sig);
	}
}
