// probe: the smallest proof that verbs work in the test guest. Two RC queue pairs on the first
// RDMA device, connected to each other; one 4 KiB one-sided RDMA READ of a patterned buffer.
// Prints "probe: PASS ..." or "probe: FAIL ..." and exits 0/1.
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#define FAIL(...) do { printf("probe: FAIL "); printf(__VA_ARGS__); printf("\n"); return 1; } while (0)

static int connect_qp(struct ibv_qp *qp, uint32_t dqpn, union ibv_gid *dgid, int gidx) {
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0,
		.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return errno;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = dqpn; a.rq_psn = 0;
	a.max_dest_rd_atomic = 16; a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1; a.ah_attr.grh.dgid = *dgid; a.ah_attr.grh.sgid_index = gidx;
	a.ah_attr.grh.hop_limit = 1; a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) return errno;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = 0;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) return errno;
	return 0;
}

int main(int argc, char **argv) {
	int gidx = argc > 1 ? atoi(argv[1]) : 0, n = 0;
	struct ibv_device **devs = ibv_get_device_list(&n);
	if (!devs || n == 0) FAIL("no RDMA device (ibv_get_device_list: %s)", strerror(errno));
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	if (!ctx) FAIL("ibv_open_device(%s): %s", ibv_get_device_name(devs[0]), strerror(errno));
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, gidx, &gid)) FAIL("ibv_query_gid %d: %s", gidx, strerror(errno));
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!pd || !cq) FAIL("pd/cq: %s", strerror(errno));
	char *remote = aligned_alloc(4096, 4096), *local = aligned_alloc(4096, 4096);
	for (int i = 0; i < 4096; i++) remote[i] = (char)(i * 7 + 3);
	memset(local, 0, 4096);
	struct ibv_mr *rmr = ibv_reg_mr(pd, remote, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_mr *lmr = ibv_reg_mr(pd, local, 4096, IBV_ACCESS_LOCAL_WRITE);
	if (!rmr || !lmr) FAIL("ibv_reg_mr: %s", strerror(errno));
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qa_ = ibv_create_qp(pd, &qa), *qb = ibv_create_qp(pd, &qa);
	if (!qa_ || !qb) FAIL("ibv_create_qp: %s", strerror(errno));
	int e;
	if ((e = connect_qp(qa_, qb->qp_num, &gid, gidx)) || (e = connect_qp(qb, qa_->qp_num, &gid, gidx)))
		FAIL("connect qp: %s", strerror(e));
	struct ibv_sge sge = {.addr = (uintptr_t)local, .length = 4096, .lkey = lmr->lkey};
	struct ibv_send_wr wr = {.wr_id = 42, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = {.remote_addr = (uintptr_t)remote, .rkey = rmr->rkey}}, *bad;
	if ((e = ibv_post_send(qa_, &wr, &bad))) FAIL("ibv_post_send: %s", strerror(e));
	struct ibv_wc wc;
	long spins = 0;
	while ((e = ibv_poll_cq(cq, 1, &wc)) == 0)
		if (++spins > 2000000000L) FAIL("no completion");
	if (e < 0 || wc.status != IBV_WC_SUCCESS) FAIL("completion: %s", ibv_wc_status_str(wc.status));
	if (memcmp(local, remote, 4096)) FAIL("page differs after RDMA READ");
	printf("probe: PASS one 4 KiB RDMA READ on %s (gid index %d, %ld empty polls)\n",
		ibv_get_device_name(devs[0]), gidx, spins);
	return 0;
}
