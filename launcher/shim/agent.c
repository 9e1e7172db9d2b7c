/* agent.c: the agent farmem injects into a program it cannot preload libfarmem.so into (a
 * statically linked one). It is the agent thread of shim.c and nothing else: the work is
 * agent.h's, shared with the shim.
 *
 * farmem (launcher/static.go, through package inject) stops the program before its first
 * instruction, maps this file's loadable segments, writes fm_params, makes the program's
 * userfaultfd and takes it, and runs fm_start_entry, which starts the thread on a stack farmem
 * mapped next to the agent. The thread connects to the runtime and serves it like the shim's;
 * the runtime then has it install the mapping filter at once, which for a static program is how
 * every mapping is seen (there is no interposed mmap) and how its forks are handed to farmem.
 * farmem stops each fork child at its birth and runs fm_fork_entry in it: the shim's atfork
 * handler, here (the child inherited this image at the same address).
 *
 * Built freestanding and position independent (Makefile: -nostdlib -ffreestanding -static-pie),
 * with no relocation to apply: it runs wherever farmem maps it, with no loader. No TLS (the
 * thread has none: the program has not set its own up yet), no stack protector (it reads TLS). */
#define _GNU_SOURCE
#include "agent.h"

/* fm_params is written by farmem before the agent starts. */
struct fm_params {
	char sock[108];     /* the runtime's socket ('@': abstract) */
	int32_t ufd;        /* the program's userfaultfd, which farmem made in it */
	uint64_t mem;       /* the agent's memory: a guard page, the thread's stack, this image */
	uint64_t mem_len;
	uint64_t stack_top; /* the agent thread's stack */
	int32_t lifeline;   /* the read end of the program's lifeline (agent.h, make_lifeline) */
	int32_t uffd_dev;   /* a /dev/userfaultfd descriptor farmem sent a process that may not open
			     * the device (it runs as another user), or -1: a fork child's uffd is
			     * made on it (agent.h, open_uffd) */
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

/* Nobody waits for the runtime's go-ahead inside the program: farmem holds the program (or the
 * fork child) stopped until the agent is attached and its filter installed. */
static void fm_agent_ready(void) {}

/* fm_agent_thread is the agent thread: it starts with every signal blocked (clone_thread), so the
 * program's handlers never run on it. */
__attribute__((noreturn)) static void fm_agent_thread(void)
{
	agent_sock = connect_path(fm_params.sock);
	if (agent_sock < 0) die_runtime_lost();
	agent_serve(fm_params.mem, fm_params.mem_len);
	for (;;) raw6(SYS_exit, 0, 0, 0, 0, 0, 0);
}

/* spawn_agent starts the agent thread with every signal blocked from its first instruction: in a
 * process farmem attached to, the program's handlers are installed, and while farmem holds every
 * other thread stopped the new thread is the only one a signal for the process can go to. */
static long spawn_agent(void) { return clone_thread(fm_params.stack_top, fm_agent_thread); }

/* fm_start: in the program farmem started, stopped before its first instruction: farmem has made
 * its uffd and lifeline (fm_params) and attached it; start the agent thread. */
__attribute__((used)) long fm_start(void)
{
	ufd = fm_params.ufd;
	lifeline = fm_params.lifeline;
	uffd_dev = fm_params.uffd_dev;
	return spawn_agent();
}

/* fm_fork_child: in a fork child of the program, stopped by farmem at its birth: say the child's
 * hello, as the shim's atfork handler does, and start its agent thread. */
__attribute__((used)) long fm_fork_child(void)
{
	fork_child_hello(fm_params.sock);
	return spawn_agent();
}

/* Where farmem points a stopped thread (any stack pointer; farmem sets one it may use): each
 * calls its function and stops on the int3, where farmem takes the result from rax and puts
 * every register back. */
__asm__(".text\n"
	".globl fm_start_entry, fm_fork_entry\n"
	".hidden fm_start_entry, fm_fork_entry\n"
	"fm_start_entry:\n"
	"	and $-16, %rsp\n"
	"	call fm_start\n"
	"	int3\n"
	"fm_fork_entry:\n"
	"	and $-16, %rsp\n"
	"	call fm_fork_child\n"
	"	int3\n");
