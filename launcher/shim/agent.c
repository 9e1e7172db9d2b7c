/* agent.c: the agent farmem injects into a program it cannot preload libfarmem.so into (a
 * statically linked one). It is the agent thread of shim.c and nothing else: the work is
 * agent.h's, shared with the shim.
 *
 * farmem (launcher/static.go, through package inject) stops the program before its first
 * instruction, maps this file's loadable segments, writes fm_params, makes the program's
 * userfaultfd and takes it, and makes the thread with a clone at fm_clone_entry, on a stack it
 * mapped next to the agent. The thread connects to the runtime and serves it like the shim's;
 * the runtime then has it install the mapping filter at once, which for a static program is how
 * every mapping is seen (there is no interposed mmap) and how its forks are guarded.
 *
 * Built freestanding and position independent (Makefile: -nostdlib -ffreestanding -static-pie),
 * with no relocation to apply: it runs wherever farmem maps it, with no loader. No TLS (the
 * thread has none: the program has not set its own up yet), no stack protector (it reads TLS). */
#define _GNU_SOURCE
#include "agent.h"

/* fm_params is written by farmem before the thread starts. */
struct fm_params {
	char sock[108];   /* the runtime's socket ('@': abstract) */
	uint64_t mem;     /* the agent's memory: this image and the thread's stack */
	uint64_t mem_len;
};
__attribute__((used)) struct fm_params fm_params;

/* The few libc functions the compiler and agent.h call. */
void *memcpy(void *d, const void *s, size_t n)
{
	char *dp = d;
	const char *sp = s;
	while (n--) *dp++ = *sp++;
	return d;
}
void *memset(void *d, int c, size_t n)
{
	char *dp = d;
	while (n--) *dp++ = (char)c;
	return d;
}
size_t strlen(const char *s)
{
	size_t n = 0;
	while (s[n]) n++;
	return n;
}

/* Nobody waits for the runtime's go-ahead inside the program: farmem holds the program stopped
 * until the agent is attached and its filter installed. */
static void fm_agent_ready(void) {}

__attribute__((used, noreturn)) void fm_agent_thread(void)
{
	/* The program's handlers must not run here. Until this, a signal for the process could be
	 * delivered to this thread, but no handler is installed yet (the program has not run), so
	 * its default action is the process's whichever thread takes it. */
	uint64_t all = ~0ULL;
	raw6(SYS_rt_sigprocmask, SIG_BLOCK, (long)&all, 0, sizeof all, 0, 0);
	agent_sock = connect_path(fm_params.sock);
	if (agent_sock < 0) die_runtime_lost();
	agent_serve(fm_params.mem, fm_params.mem_len);
	for (;;) raw6(SYS_exit, 0, 0, 0, 0, 0, 0);
}

/* fm_clone_entry: farmem points the stopped main thread here with rax = SYS_clone and the clone
 * arguments set (the new thread's stack in rsi). The new thread finds rax 0 and runs the agent
 * on its stack; the main thread (or a failed clone) stops on the int3, where farmem takes the
 * result from rax and puts every register back. */
__asm__(".text\n"
	".globl fm_clone_entry\n"
	".hidden fm_clone_entry\n"
	"fm_clone_entry:\n"
	"	syscall\n"
	"	test %rax, %rax\n"
	"	jnz 1f\n"
	"	xor %ebp, %ebp\n"
	"	and $-16, %rsp\n"
	"	call fm_agent_thread\n"
	"1:	int3\n");
