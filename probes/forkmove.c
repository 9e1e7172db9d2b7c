/* forkmove: can a page moved with UFFDIO_MOVE while another thread forks end up in neither of
 * the child's copies? fork copies the address space one mapping after another in address order;
 * a move from a mapping not yet copied into one already copied would take the page out of both.
 * This probe tries that as hard as it can: N tokens (page k holds k) move back and forth between a
 * low mapping A and a high mapping B, both registered on one uffd (a move's destination must be),
 * one page per UFFDIO_MOVE, on a thread that does nothing else, while another thread forks with a
 * raw clone(SIGCHLD) (no atfork handler runs) and each child counts, for every k, the copies of
 * token k it finds in A and B. Between A and B lie thousands of small mappings, each touched,
 * so that the fork spends its time between the two. A child reports a token it finds nowhere
 * (lost) or twice (doubled).
 *
 *   cc -O2 -o forkmove probes/forkmove.c -lpthread
 *   ./forkmove [forks] [fillers]
 *
 * What it found, with its rows, is results/forkmove.md. Why a move made inside a clone call can
 * neither lose nor double a token: fork write-locks each mapping it copies until it is done with
 * the whole address space, and a move that cannot read-lock one of its two mappings takes the
 * mmap lock, which fork holds throughout. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

struct mvs { uint64_t dst, src, len, mode; int64_t move; };
#define MOVE 0xC028AA05UL
#define PG 4096UL
#define N 256
#define MAGIC 0x5eed000000000000ULL

static char *A, *B;
static int uffd;
static volatile int stop;
static long moves, busy, during;
static volatile int forking; /* the forker is inside clone */

static int has(char *base, int k) { return *(volatile uint64_t *)(base + k * PG) == MAGIC + k; }

static void *mover(void *arg)
{
	(void)arg;
	unsigned char v;
	while (!stop) {
		for (int k = 0; k < N && !stop; k++) {
			int inB = mincore(B + k * PG, PG, &v) == 0 && (v & 1);
			char *src = inB ? B : A, *dst = inB ? A : B;
			struct mvs m = { (uint64_t)(dst + k * PG), (uint64_t)(src + k * PG), PG, 0, 0 };
			int f = forking;
			if (ioctl(uffd, MOVE, &m) == 0) {
				moves++;
				during += f && forking; /* began and ended inside one clone call */
			} else if (errno == EBUSY) {
				/* shared with a child that has gone: a write makes it ours alone again */
				busy++;
				volatile uint64_t *p = (volatile uint64_t *)(src + k * PG);
				*p = *p;
			}
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	int forks = argc > 1 ? atoi(argv[1]) : 2000;
	int fillers = argc > 2 ? atoi(argv[2]) : 4000;
	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = { .api = UFFD_API };
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) { perror("uffd"); return 1; }
	uintptr_t base = 0x100000000000UL;
	A = mmap((void *)base, N * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	/* fillers: one page each, alternating protections so that none merge, each touched */
	for (int i = 0; i < fillers; i++) {
		char *f = mmap((void *)(base + (N + 1 + 2 * i) * PG), PG, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (f == MAP_FAILED) { perror("filler"); return 1; }
		f[0] = 1;
		if (i & 1) mprotect(f, PG, PROT_READ);
	}
	B = mmap((void *)(base + (N + 2 + 2 * fillers) * PG), N * PG, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (A == MAP_FAILED || B == MAP_FAILED) { perror("mmap"); return 1; }
	for (int k = 0; k < N; k++) *(uint64_t *)(B + k * PG) = MAGIC + k;
	struct uffdio_register r = { .range = { (uint64_t)A, N * PG }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (ioctl(uffd, UFFDIO_REGISTER, &r)) { perror("register A"); return 1; }
	r = (struct uffdio_register){ .range = { (uint64_t)B, N * PG }, .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (ioctl(uffd, UFFDIO_REGISTER, &r)) { perror("register B"); return 1; }
	pthread_t t;
	pthread_create(&t, 0, mover, 0);
	long lost = 0, doubled = 0, bad = 0;
	for (int i = 0; i < forks; i++) {
		forking = 1;
		long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
		if (pid == 0) {
			int l = 0, d = 0;
			for (int k = 0; k < N; k++) {
				int c = has(A, k) + has(B, k);
				l += c == 0, d += c == 2;
			}
			syscall(SYS_exit_group, (l ? 1 : 0) | (d ? 2 : 0) | (l > 63 ? 63 : l) << 2);
		}
		forking = 0;
		int st;
		if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) { bad++; continue; }
		int code = WEXITSTATUS(st);
		if (code & 1) lost += code >> 2 ? code >> 2 : 1, bad++;
		if (code & 2) doubled++, bad++;
	}
	stop = 1;
	pthread_join(t, 0);
	printf("forks %d fillers %d moves %ld moves_inside_a_clone %ld ebusy %ld children_bad %ld tokens_lost %ld children_doubled %ld\n",
	       forks, fillers, moves, during, busy, bad, lost, doubled);
	return bad != 0;
}
