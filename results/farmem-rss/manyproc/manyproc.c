/* manyproc: N processes that each hold MIB MiB at once, so that a cap below N*MIB evicts pages
 * of every one: farmem's own memory with a store space a process (results/farmem-rss.md).
 * The parent forks N children; each fills MIB MiB with words it can verify, waits until every
 * child has filled (a pipe), rewrites every page once more, verifies every page, and exits 0,
 * or 1 on a wrong page. The parent exits with the number of children that failed.
 *   cc -O2 -o manyproc manyproc.c; manyproc N MIB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static uint64_t word(size_t i, int k, int pass) { return (i * 0x9e3779b97f4a7c15ULL) ^ ((uint64_t)k << 48) ^ pass; }

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: manyproc N MIB\n");
		return 2;
	}
	int n = atoi(argv[1]);
	size_t words = (strtoul(argv[2], 0, 10) << 20) / 8;
	int filled[2], go[2];
	if (pipe(filled) || pipe(go)) return 2;
	for (int k = 0; k < n; k++) {
		if (fork() == 0) {
			uint64_t *m = mmap(0, words * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (m == MAP_FAILED) _exit(1);
			for (size_t i = 0; i < words; i += 512) m[i] = word(i, k, 0);
			if (write(filled[1], "x", 1) != 1) _exit(1);
			char c;
			if (read(go[0], &c, 1) != 1) _exit(1);
			size_t bad = 0;
			for (size_t i = 0; i < words; i += 512) {
				bad += m[i] != word(i, k, 0);
				m[i] = word(i, k, 1);
			}
			for (size_t i = 0; i < words; i += 512) bad += m[i] != word(i, k, 1);
			_exit(bad != 0);
		}
	}
	for (int k = 0; k < n; k++) {
		char c;
		if (read(filled[0], &c, 1) != 1) return 2;
	}
	for (int k = 0; k < n; k++)
		if (write(go[1], "x", 1) != 1) return 2;
	int failed = 0, st;
	while (wait(&st) > 0) failed += !WIFEXITED(st) || WEXITSTATUS(st);
	printf("manyproc: %d processes of %s MiB, %d failed\n", n, argv[2], failed);
	return failed;
}
