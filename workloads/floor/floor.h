/* floor.h: what floorpager.c and floorshim.c share: the messages between the pager and the
 * shim in the program, and the UAPI bits the build's kernel headers may lack (UFFDIO_MOVE is
 * Linux 6.8; the headers here can be older than the kernel). */
#ifndef FLOOR_H
#define FLOOR_H
#include <stdint.h>
#include <linux/userfaultfd.h>

#define FL_PAGE 4096UL
/* Eviction batches take at most this many pages, as farmem's (evictor.BatchPages): the
 * staging area is this large. */
#define FL_BATCH 256
/* The shim reports anonymous private writable mappings at least this long. */
#define FL_MIN_MAP (64UL << 10)

/* Environment: the fds the pager leaves open in the program for its two connections, and
 * where the shim is (for the pager). */
#define FL_ENV_CTL "FLOOR_CTL_FD"
#define FL_ENV_AGENT "FLOOR_AGENT_FD"
#define FL_ENV_SHIM "FLOOR_SHIM"
/* With floorpager --inproc: "CAP_PAGES,SPLIT_WAKE", and the shim pages the program itself. */
#define FL_ENV_INPROC "FLOOR_INPROC"

enum {
	FL_HELLO = 1,    /* shim->pager on ctl, the uffd attached: a=features granted */
	FL_HELLO_OK,     /* pager->shim: a=status (0 ok) */
	FL_REGISTER,     /* shim->pager: a=addr b=len */
	FL_REGISTER_OK,  /* pager->shim: a=status (0 ok, else errno) */
	FL_AGENT_HELLO,  /* agent->pager on the agent connection: a=staging address (0: none) b=errno c=tid */
	FL_MOVE,         /* pager->agent: n runs follow; move run i's pages to staging, in order */
	FL_MOVE_DONE,    /* agent->pager: a=pages moved b=first errno (0: all) c=ns the ioctls took */
	FL_DROP,         /* pager->agent: madvise(DONTNEED) the first a pages of the staging area */
	FL_DROP_DONE,    /* agent->pager: a=status b=ns the madvise took */
};

struct fl_msg {
	uint32_t type;
	int32_t n;
	uint64_t a, b, c;
};
struct fl_run { uint64_t addr, len; };

#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef UFFDIO_MOVE
struct uffdio_move {
	__u64 dst, src, len;
#define UFFDIO_MOVE_MODE_DONTWAKE ((__u64)1 << 0)
#define UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES ((__u64)1 << 1)
	__u64 mode;
	__s64 move;
};
#define UFFDIO_MOVE _IOWR(UFFDIO, 0x05, struct uffdio_move)
#endif
#endif
