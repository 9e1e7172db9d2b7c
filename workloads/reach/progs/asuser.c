/* asuser USER PROGRAM [ARGS...]: run PROGRAM as USER (its primary group, no supplementary
 * groups), keeping as ambient capabilities the ones farmem's shim needs in a program that is not
 * root: CAP_SYS_PTRACE (a userfaultfd with fork events), CAP_SYS_ADMIN (the mapping filter),
 * CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (the shim and socket in farmem's root-only directory).
 * For a server that refuses to run as root (postgres) under `farmem run`, which runs as root.
 * setpriv(1) cannot do it under farmem: it sets keep-caps on its own thread only, so the shim's
 * agent thread loses CAP_SETGID at setresuid and glibc aborts on the setresgid after it. Here
 * the groups go first, while every thread is still root. */
#define _GNU_SOURCE
#include <grp.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static const int caps[] = {CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH};

static void die(const char *what)
{
	perror(what);
	exit(125);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: asuser USER PROGRAM [ARGS...]\n");
		return 125;
	}
	struct passwd *pw = getpwnam(argv[1]);
	if (!pw) {
		fprintf(stderr, "asuser: no user %s\n", argv[1]);
		return 125;
	}
	if (setgroups(0, NULL) || setgid(pw->pw_gid)) die("asuser: setgid");
	if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0)) die("asuser: keep-caps");
	if (setuid(pw->pw_uid)) die("asuser: setuid");
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2];
	memset(d, 0, sizeof d);
	for (unsigned i = 0; i < sizeof caps / sizeof caps[0]; i++) {
		d[caps[i] / 32].effective |= 1u << (caps[i] % 32);
		d[caps[i] / 32].permitted |= 1u << (caps[i] % 32);
		d[caps[i] / 32].inheritable |= 1u << (caps[i] % 32);
	}
	if (syscall(SYS_capset, &h, d)) die("asuser: capset");
	for (unsigned i = 0; i < sizeof caps / sizeof caps[0]; i++)
		if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, caps[i], 0, 0)) die("asuser: ambient");
	setenv("HOME", pw->pw_dir, 1);
	setenv("USER", pw->pw_name, 1);
	execv(argv[2], argv + 2);
	die("asuser: exec");
}
