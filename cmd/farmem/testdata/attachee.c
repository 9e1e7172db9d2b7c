/* attachee: a running process for farmem attach's tests. It fills MIB MiB with data every page
 * of which it can verify (each page's words derive from its index and the number of times it
 * was rewritten), prints "ready", and answers commands on stdin, a line each:
 *   check  verify every page: "ok SUM forks N bad M" (M: fork children or churned pages that
 *          found a page not their own), or "BAD page P" and exit 1
 *   write  rewrite every 7th page: "written"
 *   exit   exit 0
 * With FORKERS > 0, that many threads fork for ever: each child verifies every 8th page,
 * rewrites a few and verifies them again (forks and rewrites take one lock), and exits 0, or 1 on a wrong page. With CHURN > 0, a
 * thread verifies and rewrites random pages for ever (pages come and go all the time); without
 * one, the forking threads fork at the same time ("write" must not be sent then). With RAW 1,
 * the threads fork with a raw clone(SIGCHLD) system call rather than glibc's fork(): no atfork
 * handler runs, in the parent or in the child (which touches nothing of glibc's but _exit).
 * usage: attachee MIB [FORKERS [CHURN [RAW]]] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static uint64_t *buf;
static uint32_t *gen;
static size_t npages;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* the churn thread's pages and gen */
static long forks, bad; /* atomics: several threads count */
static int churners, raw;

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static void fill(size_t p)
{
	uint64_t seed = mix(p * 1000003ULL + gen[p] * 7919ULL);
	for (size_t i = 0; i < WORDS; i++) buf[p * WORDS + i] = mix(seed + i);
}

static int ok(size_t p)
{
	uint64_t seed = mix(p * 1000003ULL + gen[p] * 7919ULL);
	for (size_t i = 0; i < WORDS; i++)
		if (buf[p * WORDS + i] != mix(seed + i)) return 0;
	return 1;
}

/* say writes a line to stderr with one write: a fork child has nothing of stdio's it may use. */
static void say(const char *fmt, ...)
{
	char line[128];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	if (n > 0) (void)!write(2, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
}

/* wrong_exit ends a fork child that found page p wrong, saying which check found it. */
static void wrong_exit(const char *check, size_t p)
{
	say("attachee: fork child %d: %s page %zu wrong\n", (int)getpid(), check, p);
	_exit(1);
}

static void *forker(void *arg)
{
	(void)arg;
	for (;;) {
		/* Under the lock while pages are rewritten (CHURN, write): the child's copy never
		 * holds a page half rewritten. Without a churn thread, forkers fork at the same time. */
		if (churners) pthread_mutex_lock(&mu);
		pid_t c = raw ? (pid_t)syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0) : fork();
		if (c == 0) {
			for (size_t p = 0; p < npages; p += 8)
				if (!ok(p)) wrong_exit("inherited", p);
			for (size_t p = 3; p < npages; p += 64) {
				gen[p]++;
				fill(p);
			}
			for (size_t p = 3; p < npages; p += 64)
				if (!ok(p)) wrong_exit("rewritten", p);
			_exit(0);
		}
		if (churners) pthread_mutex_unlock(&mu);
		if (c < 0) continue;
		int st;
		if (waitpid(c, &st, 0) == c) {
			__atomic_add_fetch(&forks, 1, __ATOMIC_RELAXED);
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
				__atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
				if (WIFSIGNALED(st)) say("attachee: fork child %d killed by signal %d\n", (int)c, WTERMSIG(st));
			}
		}
	}
	return NULL;
}

static void *churn(void *arg)
{
	(void)arg;
	uint64_t r = 42;
	for (;;) {
		r = mix(r);
		size_t p = r % npages;
		pthread_mutex_lock(&mu);
		if (!ok(p)) {
			__atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
			say("attachee: churned page %zu wrong\n", p);
		}
		if (r & 1) {
			gen[p]++;
			fill(p);
		}
		pthread_mutex_unlock(&mu);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: attachee MIB [FORKERS [CHURN [RAW]]]\n");
		return 2;
	}
	size_t bytes = strtoul(argv[1], 0, 10) << 20;
	int forkers = argc > 2 ? atoi(argv[2]) : 0;
	churners = argc > 3 ? atoi(argv[3]) : 0;
	raw = argc > 4 && atoi(argv[4]) != 0;
	npages = bytes / PAGE;
	buf = mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gen = calloc(npages, sizeof *gen);
	if (buf == MAP_FAILED || !gen) return 2;
	for (size_t p = 0; p < npages; p++) fill(p);
	pthread_t t;
	for (int i = 0; i < forkers; i++) pthread_create(&t, 0, forker, 0);
	for (int i = 0; i < churners; i++) pthread_create(&t, 0, churn, 0);
	setvbuf(stdout, 0, _IOLBF, 0);
	printf("ready\n");
	char line[64];
	while (fgets(line, sizeof line, stdin)) {
		if (!strncmp(line, "check", 5)) {
			pthread_mutex_lock(&mu);
			uint64_t sum = 0;
			for (size_t p = 0; p < npages; p++) {
				if (!ok(p)) {
					printf("BAD page %zu\n", p);
					exit(1);
				}
				sum += buf[p * WORDS];
			}
			pthread_mutex_unlock(&mu);
			printf("ok %016llx forks %ld bad %ld\n", (unsigned long long)sum, forks, bad);
		} else if (!strncmp(line, "write", 5)) {
			pthread_mutex_lock(&mu);
			for (size_t p = 0; p < npages; p += 7) {
				gen[p]++;
				fill(p);
			}
			pthread_mutex_unlock(&mu);
			printf("written\n");
		} else if (!strncmp(line, "exit", 4)) {
			return 0;
		}
	}
	return 0;
}
