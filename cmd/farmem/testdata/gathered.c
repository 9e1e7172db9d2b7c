/* gathered: two threads touch random pages of a shared 64 MiB buffer, about 20,000 pages each
 * (at a 16 MiB cap, most of them faults, many thousand a second), then each reports how many
 * CPUs it may run on and which it is on ("paging T CPUS CPU"); both wait 2.5 s without a fault
 * and report again ("quiet T CPUS CPU"). Every page keeps the byte it was filled with, checked
 * at the end ("check ok" or "check BAD N"). */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGES (64 << 8)
static unsigned char *buf;
static pthread_barrier_t paged;

static void report(const char *when, int t)
{
	cpu_set_t s;
	sched_getaffinity(0, sizeof s, &s);
	printf("%s %d %d %d\n", when, t, CPU_COUNT(&s), sched_getcpu());
	fflush(stdout);
}

static void *touch(void *arg)
{
	int t = (int)(intptr_t)arg;
	uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(t + 1);
	for (int i = 0; i < 20000; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		size_t p = x % PAGES;
		buf[p * 4096] = (unsigned char)p;
	}
	report("paging", t);
	pthread_barrier_wait(&paged);
	sleep(2);
	usleep(500000);
	report("quiet", t);
	return NULL;
}

int main(void)
{
	buf = mmap(0, (size_t)PAGES * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) return 2;
	for (size_t p = 0; p < PAGES; p++) buf[p * 4096] = (unsigned char)p;
	pthread_barrier_init(&paged, NULL, 2);
	pthread_t a, b;
	pthread_create(&a, NULL, touch, (void *)0);
	pthread_create(&b, NULL, touch, (void *)1);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	long bad = 0;
	for (size_t p = 0; p < PAGES; p++) bad += buf[p * 4096] != (unsigned char)p;
	if (bad) printf("check BAD %ld\n", bad);
	else printf("check ok\n");
	return bad != 0;
}
