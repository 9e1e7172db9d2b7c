/* daemonize, for TestOrphanedForkChildServed: fills MIB MiB with verifiable pages and forks; the
 * parent exits at once, and the child, orphaned before farmem has read its hello, verifies every
 * page and prints "child ok SUM".
 * usage: daemonize MIB */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#define PAGE 4096
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}
int main(int argc, char **argv)
{
	size_t n = (strtoul(argv[1], 0, 10) << 20) / 8;
	uint64_t *b = mmap(0, n * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (size_t i = 0; i < n; i++) b[i] = mix(i);
	fflush(stdout);
	pid_t c = fork();
	if (c < 0) return 2;
	if (c > 0) _exit(0);
	setsid();
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++) {
		if (b[i] != mix(i)) { printf("child BAD word %zu\n", i); return 1; }
		sum += b[i];
	}
	printf("child ok %016llx\n", (unsigned long long)sum);
	return 0;
}
