/* forkexec: a process that forks, or forks and execs, again and again while it holds memory that
 * farmem pages: how much each of farmem's ways into a program (the preloaded shim, or injection
 * through ptrace) costs a program that makes processes (a shell, make, a server that forks per
 * job). Used by workloads/forkexec/mechanism.sh.
 *
 *   forkexec MIB N fork   N times: fork a child that checks 16 random pages of its copy of the
 *                         MIB MiB and exits; the parent waits for it and rewrites 16 pages
 *   forkexec MIB N exec   the same, but the child execs /bin/true (a new image each time)
 *
 * Every page's first word derives from its index and its generation, the rest of it from the
 * first word; a child that finds a wrong page exits 1, and the parent then stops. At the end the
 * parent checks every page. It prints one line: "forkexec: MODE N in S s: R per s, digest D, OK"
 * (or BAD and exit 1). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static uint64_t *mem;
static uint32_t *gen;
static size_t pages;

static uint64_t word(size_t p, uint32_t g, size_t i) {
	uint64_t x = (p * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)g << 32) ^ i;
	x ^= x >> 29;
	return x * 0xbf58476d1ce4e5b9ULL;
}

static void fill(size_t p) {
	for (size_t i = 0; i < WORDS; i++)
		mem[p * WORDS + i] = word(p, gen[p], i);
}

static int good(size_t p) {
	for (size_t i = 0; i < WORDS; i++)
		if (mem[p * WORDS + i] != word(p, gen[p], i))
			return 0;
	return 1;
}

static uint64_t rng = 88172645463325252ULL;
static size_t pick(void) {
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng % pages;
}

int main(int argc, char **argv) {
	if (argc != 4 || (strcmp(argv[3], "fork") && strcmp(argv[3], "exec"))) {
		fprintf(stderr, "usage: forkexec MIB N fork|exec\n");
		return 2;
	}
	pages = (size_t)atol(argv[1]) * 256;
	long n = atol(argv[2]);
	int execs = !strcmp(argv[3], "exec");
	mem = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	gen = calloc(pages, sizeof *gen);
	if (mem == MAP_FAILED || !gen) {
		perror("forkexec: memory");
		return 2;
	}
	for (size_t p = 0; p < pages; p++)
		fill(p);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (long k = 0; k < n; k++) {
		pid_t c = fork();
		if (c < 0) {
			perror("forkexec: fork");
			return 2;
		}
		if (c == 0) {
			if (execs) {
				execl("/bin/true", "true", (char *)NULL);
				_exit(3);
			}
			for (int j = 0; j < 16; j++)
				if (!good(pick()))
					_exit(1);
			_exit(0);
		}
		int st;
		if (waitpid(c, &st, 0) != c || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			printf("forkexec: BAD: child %ld ended with status %#x\n", k, st);
			return 1;
		}
		for (int j = 0; j < 16; j++) {
			size_t p = pick();
			gen[p]++;
			fill(p);
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	uint64_t digest = 0;
	for (size_t p = 0; p < pages; p++) {
		if (!good(p)) {
			printf("forkexec: BAD: page %zu\n", p);
			return 1;
		}
		digest = digest * 31 + mem[p * WORDS] + gen[p];
	}
	double s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("forkexec: %s %ld in %.3f s: %.1f per s, digest %016llx, OK\n", argv[3], n, s, n / s,
	       (unsigned long long)digest);
	return 0;
}
