/* execwindow: how long an image a served process exec's runs before farmem freezes it to enter
 * it, and how much fresh memory it can touch meanwhile (farmem registers and counts it only once
 * the image is frozen: launcher/execed.go).
 *   execwindow ROUNDS STATIC-BUILD   (the launcher, dynamic: loads farmem's shim under farmem run)
 * forks ROUNDS children one after the other; each exec's STATIC-BUILD (this file built with
 * -static, which loads no shim, so farmem enters it from outside) with -child T0, T0 being
 * CLOCK_MONOTONIC just before the execve. The child touches a fresh page of a 64 MiB mapping and
 * reads the clock, in a tight loop, for 300 ms, and prints when its first instruction ran, the
 * first gap between two clock reads over 200 µs (the freeze: every thread seized; natively, a
 * preemption), how long that gap lasted, the biggest gap, and the memory touched before it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <sys/mman.h>
static long long now(void){ struct timespec ts; clock_gettime(CLOCK_MONOTONIC,&ts); return ts.tv_sec*1000000000LL+ts.tv_nsec; }
int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "-child")) {
		long long t0 = atoll(argv[2]), start = now(), prev = start, first_at = -1, first_len = 0, big = 0;
		size_t npages = 64 << 8, touched = 0, before = 0; /* 64 MiB, touched a page an iteration */
		char *mem = mmap(0, npages << 12, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		for (;;) {
			if (touched < npages) mem[(touched++) << 12] = 1;
			long long t = now();
			if (t - prev > 200000 && first_at < 0) { first_at = prev - t0; first_len = t - prev; before = touched; }
			if (t - prev > big) big = t - prev;
			prev = t;
			if (t - start > 300000000) break;
		}
		printf("exec->first-instruction %.3f ms, freeze at %.3f ms after exec, lasting %.3f ms, biggest gap %.3f ms, "
		       "%zu KiB touched before it\n", (start - t0) / 1e6, first_at / 1e6, first_len / 1e6, big / 1e6, before * 4);
		return 0;
	}
	if (argc != 3) { fprintf(stderr, "usage: execwindow ROUNDS STATIC-BUILD-OF-ITSELF\n"); return 2; }
	int rounds = atoi(argv[1]);
	for (int i = 0; i < rounds; i++) {
		pid_t c = fork();
		if (c == 0) {
			char t0[32];
			snprintf(t0, sizeof t0, "%lld", now());
			execl(argv[2], argv[2], "-child", t0, (char *)0);
			_exit(127);
		}
		waitpid(c, 0, 0);
	}
	return 0;
}
