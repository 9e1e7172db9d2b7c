/* staticfill.c: the musl C program of the static-binary tests (cmd/farmem/static_test.go),
 * built with musl-gcc -static. Like staticfill/main.go it fills MIB mebibytes with a
 * pseudo-random stream (half in 1 MiB blocks, which musl's malloc maps with mmap, half in 2 KiB
 * ones, which it takes from brk), each page starting with its own number; rewrites ROUNDS pages
 * at random, checking the number first; and prints a digest that depends only on its arguments.
 * A page whose number is wrong (zeros where farmem lost a page) is reported, exit status 99.
 *
 *	staticfill MIB ROUNDS [fork|forkspin|crash|exec]
 * fork: after the rounds, forks a child that checks every page and prints the digest (prefixed
 * "child: "), and spawns /bin/true with posix_spawn (a vfork: one mm), saying how each went;
 * forkspin: the same, but the child rewrites pages for ever; crash: dies of SIGSEGV after the
 * rounds instead of printing; exec: first execs itself again in fork mode. */
#include <errno.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { PAGE = 4096, BIG = 1 << 20, SMALL = 2048 };
static uint64_t rng = 88172645463325252ULL;
static uint64_t next(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }

extern char **environ;

int main(int argc, char **argv)
{
	if (argc < 3) { fprintf(stderr, "usage: staticfill MIB ROUNDS [fork|crash]\n"); return 2; }
	long mib = atol(argv[1]), rounds = atol(argv[2]);
	const char *mode = argc > 3 ? argv[3] : "";
	if (strcmp(mode, "exec") == 0) {
		char *args[] = { argv[0], argv[1], argv[2], "fork", 0 };
		execv("/proc/self/exe", args);
		printf("exec: %s\n", strerror(errno));
		return 3;
	}
	/* Pages, in order: the big blocks' then the small ones' (two pages to three blocks). */
	long bigs = mib / 2, npages = mib * (BIG / PAGE);
	long smalls = (npages - bigs * (BIG / PAGE)) * PAGE / SMALL;
	unsigned char **blk = malloc(sizeof *blk * (bigs + smalls));
	if (!blk) return 3;
	for (long i = 0; i < bigs; i++) if (!(blk[i] = malloc(BIG))) return 3;
	for (long i = 0; i < smalls; i++) if (!(blk[bigs + i] = malloc(SMALL))) return 3;
	/* Page k is the k-th 4 KiB of the sequence of blocks (small blocks two to a page). */
#define AT(k, off) (k < bigs * (BIG / PAGE) ? blk[(k) / (BIG / PAGE)] + (k) % (BIG / PAGE) * PAGE + (off) \
					     : blk[bigs + ((k) - bigs * (BIG / PAGE)) * 2 + (off) / SMALL] + (off) % SMALL)
	for (long k = 0; k < npages; k++) {
		memcpy(AT(k, 0), &k, 8);
		for (int off = 8; off < PAGE; off += 8) { uint64_t v = next(); memcpy(AT(k, off), &v, 8); }
	}
	int spin = strcmp(mode, "forkspin") == 0;
	if (spin) mode = "fork";
	for (long r = 0; r < rounds; r++) {
		long k = next() % npages;
		long got;
		memcpy(&got, AT(k, 0), 8);
		if (got != k) { printf("BAD page %ld holds %ld\n", k, got); fflush(stdout); return 99; }
		uint64_t seed = next();
		for (int off = 8; off < PAGE; off++) *AT(k, off) ^= (unsigned char)(seed >> (off % 64));
	}
	if (strcmp(mode, "crash") == 0) *(volatile int *)0 = 1;
	const char *who = "";
	if (strcmp(mode, "fork") == 0) {
		fflush(stdout);
		pid_t p = fork();
		if (p < 0) printf("fork: %s\n", strerror(errno));
		if (p == 0) who = "child: ";
		for (long k; p == 0 && spin;) { /* rewrite pages for ever, checking each first */
			k = next() % npages;
			long got;
			memcpy(&got, AT(k, 0), 8);
			if (got != k) { printf("child: BAD page %ld holds %ld\n", k, got); fflush(stdout); return 99; }
			*AT(k, 8) ^= 1;
		}
		if (p > 0) {
			int st;
			waitpid(p, &st, 0);
			printf("fork: child exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
			char *args[] = { "/bin/true", 0 };
			int e = posix_spawn(&p, "/bin/true", 0, 0, args, environ);
			if (e) printf("posix_spawn: %s\n", strerror(e));
			else { waitpid(p, &st, 0); printf("posix_spawn: exit %d\n", WEXITSTATUS(st)); }
		}
	}
	uint64_t h = 1469598103934665603ULL; /* FNV-1a over every page */
	for (long k = 0; k < npages; k++) {
		long got;
		memcpy(&got, AT(k, 0), 8);
		if (got != k) { printf("%sBAD page %ld holds %ld\n", who, k, got); fflush(stdout); return 99; }
		for (int off = 0; off < PAGE; off++) h = (h ^ *AT(k, off)) * 1099511628211ULL;
	}
	printf("%sstaticfill %ld MiB %ld rounds: %016llx\n", who, mib, rounds, (unsigned long long)h);
	return 0;
}
