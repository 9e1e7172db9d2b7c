//go:build rdma

package fabric

// The cgo layer over libibverbs: the only file of the package that speaks C. It is small on
// purpose: open a device, a protection domain, a queue pair with its completion queue (and,
// for a client, its registered bounce buffer), connect it, register a slab, and the hot path:
// fm_qp_rw posts a batch of 4 KiB RDMA READs or WRITEs as one chain of work requests and waits
// for the last. The work requests and scatter entries live in C memory allocated with the queue
// pair, so the hot path allocates nothing, in Go or in C, and is one cgo call per batch of up
// to the queue pair's depth.
//
// Lifetimes: a queue pair (fm_qp) owns its completion queue, completion channel, buffer and
// the buffer's memory region; destroying it destroys them in the order verbs needs (queue pair,
// then region, then completion queue and channel). A protection domain outlives every queue
// pair and region made in it; the device outlives everything (it is opened once per process
// and never closed).

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

typedef struct {
	struct ibv_context *ctx;
	char name[64];
	uint8_t port;
	uint8_t link_layer;
	uint8_t mtu;
	uint16_t lid;
	int gid_index;
	uint8_t gid[16];
	int max_qp_wr;
	int max_rd_atom;      // responder resources per queue pair
	int max_init_rd_atom; // initiator depth per queue pair
} fm_dev;

// fm_dev_open opens the device named want (or the first with an active port when want is
// empty): 0 or an errno. *stage says what failed.
static int fm_dev_open(const char *want, int gid_index, fm_dev *d, const char **stage) {
	int n = 0, err = ENODEV;
	*stage = "ibv_get_device_list";
	errno = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list) return errno ? errno : ENODEV;
	*stage = "no device";
	for (int i = 0; i < n; i++) {
		const char *nm = ibv_get_device_name(list[i]);
		if (want[0] && strcmp(want, nm)) continue;
		struct ibv_context *ctx = ibv_open_device(list[i]);
		if (!ctx) { err = errno; *stage = "ibv_open_device"; continue; }
		struct ibv_device_attr da;
		if (ibv_query_device(ctx, &da)) { err = errno; *stage = "ibv_query_device"; ibv_close_device(ctx); continue; }
		for (int p = 1; p <= da.phys_port_cnt; p++) {
			struct ibv_port_attr pa;
			union ibv_gid gid;
			if (ibv_query_port(ctx, p, &pa)) { err = errno; *stage = "ibv_query_port"; continue; }
			if (pa.state != IBV_PORT_ACTIVE) { err = ENETDOWN; *stage = "no active port"; continue; }
			if (ibv_query_gid(ctx, p, gid_index, &gid)) { err = errno; *stage = "ibv_query_gid"; continue; }
			if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && gid.global.interface_id == 0 && gid.global.subnet_prefix == 0) {
				err = EADDRNOTAVAIL; *stage = "no GID at that index"; continue;
			}
			memset(d, 0, sizeof *d);
			d->ctx = ctx;
			strncpy(d->name, nm, sizeof d->name - 1);
			d->port = p;
			d->link_layer = pa.link_layer;
			d->mtu = pa.active_mtu;
			d->lid = pa.lid;
			d->gid_index = gid_index;
			memcpy(d->gid, gid.raw, 16);
			d->max_qp_wr = da.max_qp_wr;
			d->max_rd_atom = da.max_qp_rd_atom;
			d->max_init_rd_atom = da.max_qp_init_rd_atom;
			ibv_free_device_list(list);
			return 0;
		}
		ibv_close_device(ctx);
	}
	ibv_free_device_list(list);
	return err;
}

typedef struct {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct ibv_comp_channel *ch;
	struct ibv_mr *mr; // the buffer's; NULL without a buffer
	char *buf;
	size_t buflen;
	int depth;         // work requests per post
	struct ibv_send_wr *wrs;
	struct ibv_sge *sges;
} fm_qp;

static void fm_qp_destroy(fm_qp *q) {
	if (!q) return;
	if (q->qp) ibv_destroy_qp(q->qp);
	if (q->mr) ibv_dereg_mr(q->mr);
	if (q->buf) munmap(q->buf, q->buflen);
	if (q->cq) ibv_destroy_cq(q->cq);
	if (q->ch) ibv_destroy_comp_channel(q->ch);
	free(q->wrs);
	free(q->sges);
	free(q);
}

// fm_qp_create makes a reliable-connected queue pair in pd, in state INIT, with access the
// remote may use (0 for a client), depth work requests and a registered buffer of buflen bytes
// (none if 0). 0 or an errno; *stage says what failed.
static int fm_qp_create(fm_dev *d, struct ibv_pd *pd, int access, int depth, size_t buflen, fm_qp **out, const char **stage) {
	int err;
	fm_qp *q = calloc(1, sizeof *q);
	if (!q) return ENOMEM;
	q->depth = depth;
	*stage = "allocating work requests";
	q->wrs = calloc(depth, sizeof *q->wrs);
	q->sges = calloc(depth, sizeof *q->sges);
	if (!q->wrs || !q->sges) { err = ENOMEM; goto fail; }
	*stage = "ibv_create_comp_channel";
	if (!(q->ch = ibv_create_comp_channel(d->ctx))) goto fail_errno;
	*stage = "ibv_create_cq";
	// Room for a completion per work request: after an error every one completes (flushed).
	if (!(q->cq = ibv_create_cq(d->ctx, depth + 1, NULL, q->ch, 0))) goto fail_errno;
	if (buflen) {
		*stage = "mmap of the bounce buffer";
		q->buf = mmap(NULL, buflen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (q->buf == MAP_FAILED) { q->buf = NULL; goto fail_errno; }
		q->buflen = buflen;
		// Not in a forked child (farmem starts the program with fork and exec): the child
		// neither shares nor copies memory the device writes.
		madvise(q->buf, buflen, MADV_DONTFORK);
		*stage = "ibv_reg_mr of the bounce buffer";
		if (!(q->mr = ibv_reg_mr(pd, q->buf, buflen, IBV_ACCESS_LOCAL_WRITE))) goto fail_errno;
	}
	struct ibv_qp_init_attr ia = {.send_cq = q->cq, .recv_cq = q->cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = depth, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	*stage = "ibv_create_qp";
	if (!(q->qp = ibv_create_qp(pd, &ia))) goto fail_errno;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = d->port, .pkey_index = 0,
		.qp_access_flags = access};
	*stage = "ibv_modify_qp to INIT";
	if ((err = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))) goto fail;
	*out = q;
	return 0;
fail_errno:
	err = errno ? errno : EIO;
fail:
	fm_qp_destroy(q);
	return err;
}

// fm_qp_connect moves q to RTR then RTS, connected to the remote queue pair: 0 or an errno.
static int fm_qp_connect(fm_dev *d, fm_qp *q, uint32_t psn, uint32_t dqpn, uint32_t dpsn, uint16_t dlid,
		const uint8_t *dgid, int mtu, int rd_atomic, const char **stage) {
	int err;
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu;
	a.dest_qp_num = dqpn;
	a.rq_psn = dpsn;
	a.max_dest_rd_atomic = d->max_rd_atom > 0 ? d->max_rd_atom : 1;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = d->port;
	if (d->link_layer == IBV_LINK_LAYER_ETHERNET) { // RoCE: addressed by GID
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, dgid, 16);
		a.ah_attr.grh.sgid_index = d->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	} else {
		a.ah_attr.dlid = dlid;
	}
	*stage = "ibv_modify_qp to RTR";
	if ((err = ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))) return err;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;   // 4.096 us * 2^14 = 67 ms per try
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = psn;
	a.max_rd_atomic = rd_atomic;
	*stage = "ibv_modify_qp to RTS";
	return ibv_modify_qp(q->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static uint32_t fm_qp_num(fm_qp *q) { return q->qp->qp_num; }
static void *fm_qp_buf(fm_qp *q) { return q->buf; }

static int64_t fm_now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// Spin on the completion queue this long before sleeping on the completion channel: a
// hardware round trip is a few microseconds, far less than a sleep and wakeup here.
#define FM_SPIN_NS 20000

// fm_wait waits for the completion of work request want: 0, a failed completion's status
// (> 0), or -errno (-ETIMEDOUT when deadline, in CLOCK_MONOTONIC ns, passed).
static int fm_wait(fm_qp *q, uint64_t want, int64_t deadline) {
	struct ibv_wc wc[16];
	int64_t spin_until = fm_now_ns() + FM_SPIN_NS;
	int armed = 0;
	for (unsigned spins = 0;; spins++) {
		int m = ibv_poll_cq(q->cq, 16, wc);
		if (m < 0) return -EIO;
		for (int i = 0; i < m; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) return wc[i].status;
			if (wc[i].wr_id == want) return 0;
		}
		if (m > 0 || (spins & 63) != 0) continue;
		int64_t now = fm_now_ns();
		if (now < spin_until) continue;
		if (now >= deadline) return -ETIMEDOUT;
		if (!armed) { // arm, then poll once more: a completion may have come in between
			if (ibv_req_notify_cq(q->cq, 0)) return -EIO;
			armed = 1;
			continue;
		}
		struct pollfd pfd = {.fd = q->ch->fd, .events = POLLIN};
		int r = poll(&pfd, 1, (int)((deadline - now + 999999) / 1000000));
		if (r < 0 && errno != EINTR) return -errno;
		if (r > 0) {
			struct ibv_cq *ecq;
			void *ectx;
			if (ibv_get_cq_event(q->ch, &ecq, &ectx) == 0) ibv_ack_cq_events(ecq, 1);
			armed = 0;
		}
	}
}

// fm_qp_rw moves n pages between the buffer (page i at buf + i*4096) and the remote pages at
// raddr[i] with rkey[i]: RDMA WRITE if write, else RDMA READ. It posts them in chains of up to
// depth work requests, only the last of each signaled (a reliable connection completes them in
// order), and waits for it, timeout_ns at most per chain. 0, a failed completion's status (> 0), or -errno. After a failure
// the queue pair is in the error state (or may still complete work into the buffer, after a
// timeout): the caller destroys it.
static int fm_qp_rw(fm_qp *q, int write, int n, const uint64_t *raddr, const uint32_t *rkey, int64_t timeout_ns) {
	for (int done = 0; done < n;) {
		int k = n - done < q->depth ? n - done : q->depth;
		for (int i = 0; i < k; i++) {
			int j = done + i;
			struct ibv_sge *s = &q->sges[i];
			s->addr = (uintptr_t)(q->buf + (size_t)j * 4096);
			s->length = 4096;
			s->lkey = q->mr->lkey;
			struct ibv_send_wr *w = &q->wrs[i];
			w->wr_id = j;
			w->sg_list = s;
			w->num_sge = 1;
			w->opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
			w->send_flags = i == k - 1 ? IBV_SEND_SIGNALED : 0;
			w->wr.rdma.remote_addr = raddr[j];
			w->wr.rdma.rkey = rkey[j];
			w->next = i == k - 1 ? NULL : &q->wrs[i + 1];
		}
		struct ibv_send_wr *bad;
		int e = ibv_post_send(q->qp, q->wrs, &bad);
		if (e) return -e;
		if ((e = fm_wait(q, done + k - 1, fm_now_ns() + timeout_ns))) return e;
		done += k;
	}
	return 0;
}

static struct ibv_mr *fm_reg(struct ibv_pd *pd, void *addr, size_t len) {
	return ibv_reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
}

static int fm_errno(void) { return errno; }
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"unsafe"
)

// verbsDevice is the process's RDMA device and port.
type verbsDevice struct {
	d C.fm_dev
}

var (
	verbsDevMu sync.Mutex
	verbsDev   *verbsDevice // protected by verbsDevMu; opened once, never closed
)

// openVerbsDevice opens the device FARMEM_RDMA_DEVICE names (or the first with an active port)
// on first use. A failure is not kept: a driver loaded later is found on the next call.
func openVerbsDevice() (*verbsDevice, error) {
	verbsDevMu.Lock()
	defer verbsDevMu.Unlock()
	if verbsDev != nil {
		return verbsDev, nil
	}
	want := os.Getenv(envRDMADevice)
	gidIndex := 0
	if s := os.Getenv(envRDMAGIDIndex); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s=%q: give a GID index (0, 1, ...)", envRDMAGIDIndex, s)
		}
		gidIndex = n
	}
	cwant := C.CString(want)
	defer C.free(unsafe.Pointer(cwant))
	d := &verbsDevice{}
	var stage *C.char
	if e := C.fm_dev_open(cwant, C.int(gidIndex), &d.d, &stage); e != 0 {
		which := "no RDMA device"
		if want != "" {
			which = "no RDMA device " + strconv.Quote(want)
		}
		hint := ""
		if syscall.Errno(e) == syscall.ENOSYS || syscall.Errno(e) == syscall.ENODEV {
			hint = " (this kernel has no verbs device: load a driver, e.g. `modprobe rdma_rxe` and `rdma link add rxe0 type rxe netdev IFACE`)"
		}
		return nil, fmt.Errorf("rdma: %s with an active port and GID index %d: %s: %v%s", which, gidIndex, C.GoString(stage), syscall.Errno(e), hint)
	}
	verbsDev = d
	return d, nil
}

func (d *verbsDevice) name() string { return C.GoString(&d.d.name[0]) }

// maxDepth is the most work requests one queue pair takes at once (and one post carries).
func (d *verbsDevice) maxDepth() int { return int(d.d.max_qp_wr) }

// respDepth and initDepth are the RDMA READs a queue pair can have outstanding as responder
// and as initiator.
func (d *verbsDevice) respDepth() int { return max(1, min(int(d.d.max_rd_atom), 255)) }
func (d *verbsDevice) initDepth() int { return max(1, min(int(d.d.max_init_rd_atom), 255)) }

// info is this side's half of an RDMAConnect for q.
func (d *verbsDevice) info(q *verbsQP, psn uint32, rdAtomic int) rdmaQPInfo {
	in := rdmaQPInfo{QPN: q.num(), PSN: psn, LID: uint16(d.d.lid), MTU: uint8(d.d.mtu), RDAtomic: uint8(rdAtomic)}
	for i := range in.GID {
		in.GID[i] = byte(d.d.gid[i])
	}
	return in
}

// verbsPD is a protection domain: queue pairs and memory regions in one can reach each other,
// and nothing else.
type verbsPD struct{ p *C.struct_ibv_pd }

func (d *verbsDevice) allocPD() (verbsPD, error) {
	p, err := C.ibv_alloc_pd(d.d.ctx)
	if p == nil {
		return verbsPD{}, fmt.Errorf("rdma: ibv_alloc_pd: %v", err)
	}
	return verbsPD{p}, nil
}

// free deallocates the domain; every queue pair and region in it must be gone.
func (p verbsPD) free() {
	if p.p != nil {
		C.ibv_dealloc_pd(p.p)
	}
}

// verbsQP is a queue pair with its completion queue and, for a client, its bounce buffer.
type verbsQP struct {
	q   *C.fm_qp
	buf []byte // the registered buffer (C memory), empty without one
}

// createQP makes a queue pair in state INIT. access: what the remote may do (server side);
// bufPages: the registered bounce buffer's size (client side).
func (d *verbsDevice) createQP(pd verbsPD, access C.int, depth, bufPages int) (*verbsQP, error) {
	var q *C.fm_qp
	var stage *C.char
	if e := C.fm_qp_create(&d.d, pd.p, access, C.int(depth), C.size_t(bufPages*PageSize), &q, &stage); e != 0 {
		return nil, verbsErr(stage, e)
	}
	v := &verbsQP{q: q}
	if bufPages > 0 {
		v.buf = unsafe.Slice((*byte)(C.fm_qp_buf(q)), bufPages*PageSize)
	}
	return v, nil
}

const (
	accessNone   C.int = 0
	accessRemote C.int = C.IBV_ACCESS_REMOTE_READ | C.IBV_ACCESS_REMOTE_WRITE
)

func (q *verbsQP) num() uint32 { return uint32(C.fm_qp_num(q.q)) }

// connect makes q ready to send to and receive from the remote queue pair r.
func (d *verbsDevice) connect(q *verbsQP, psn uint32, r rdmaQPInfo, rdAtomic int) error {
	var stage *C.char
	gid := (*C.uint8_t)(unsafe.Pointer(&r.GID[0]))
	mtu := min(int(r.MTU), int(d.d.mtu))
	if e := C.fm_qp_connect(&d.d, q.q, C.uint32_t(psn), C.uint32_t(r.QPN), C.uint32_t(r.PSN), C.uint16_t(r.LID),
		gid, C.int(mtu), C.int(rdAtomic), &stage); e != 0 {
		return verbsErr(stage, e)
	}
	return nil
}

// destroy frees the queue pair and everything it owns. Nothing may use q or its buffer after.
func (q *verbsQP) destroy() {
	C.fm_qp_destroy(q.q)
	q.q, q.buf = nil, nil
}

// errWCTimeout and wcError are rw's failures.
var errWCTimeout = errors.New("no completion in time")

// wcError is a failed work completion.
type wcError C.int

func (e wcError) Error() string {
	return "work completion: " + C.GoString(C.ibv_wc_status_str(uint32(e)))
}

// remoteAccess says whether the remote refused the access: a region gone (revoked) or a
// wrong key, rather than a dead link.
func (e wcError) remoteAccess() bool {
	return e == C.IBV_WC_REM_ACCESS_ERR || e == C.IBV_WC_REM_INV_REQ_ERR || e == C.IBV_WC_REM_OP_ERR
}

// rw moves n pages between the buffer and the remote pages raddr[:n] (rkey[:n]): one cgo
// call, no allocation. n <= len(buf)/PageSize.
func (q *verbsQP) rw(write bool, n int, raddr []uint64, rkey []uint32, timeoutNs int64) error {
	w := C.int(0)
	if write {
		w = 1
	}
	e := C.fm_qp_rw(q.q, w, C.int(n), (*C.uint64_t)(unsafe.Pointer(&raddr[0])), (*C.uint32_t)(unsafe.Pointer(&rkey[0])), C.int64_t(timeoutNs))
	switch {
	case e == 0:
		return nil
	case e == -C.ETIMEDOUT:
		return errWCTimeout
	case e < 0:
		return fmt.Errorf("ibv_post_send: %v", syscall.Errno(-e))
	}
	return wcError(e)
}

// verbsMR is a registered memory region.
type verbsMR struct{ m *C.struct_ibv_mr }

// register registers mem (not Go memory: a slab's mapping) for remote read and write.
func (p verbsPD) register(mem []byte) (verbsMR, error) {
	m := C.fm_reg(p.p, unsafe.Pointer(&mem[0]), C.size_t(len(mem)))
	if m == nil {
		e := syscall.Errno(C.fm_errno())
		hint := ""
		if e == syscall.ENOMEM || e == syscall.EPERM {
			hint = " (registered memory is locked: raise the memory server's RLIMIT_MEMLOCK, `ulimit -l`, or run it as root)"
		}
		return verbsMR{}, fmt.Errorf("rdma: ibv_reg_mr of %d bytes: %v%s", len(mem), e, hint)
	}
	return verbsMR{m}, nil
}

func (m verbsMR) rkey() uint32 { return uint32(m.m.rkey) }
func (m verbsMR) addr() uint64 { return uint64(uintptr(m.m.addr)) }

// deregister ends the region: the device no longer touches its memory once it returns.
func (m verbsMR) deregister() { C.ibv_dereg_mr(m.m) }

func verbsErr(stage *C.char, e C.int) error {
	return fmt.Errorf("rdma: %s: %v", C.GoString(stage), syscall.Errno(e))
}
