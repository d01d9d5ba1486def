// SPDX-License-Identifier: GPL-2.0-only
/*
 * vstellar_uverbs: drive vstellar.ko through the raw uverbs write() ABI,
 * without libibverbs or the provider: context and the doorbell/kick mmaps,
 * PD, MR, CQ, QP through RESET -> INIT -> RTR -> RTS, query, destroy; an
 * SRQ (F_SRQ) with a QP on it.
 * Then hostile input: every bad size, address, count and mmap the driver
 * must refuse. KTAP output; exit 0 pass, 1 fail, 4 skip.
 *
 * Usage: vstellar_uverbs [/dev/infiniband/uverbsN] [ibdev name]
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <rdma/ib_user_verbs.h>
#include <vstellar/virtio_vstellar.h>
#include <vstellar/vstellar-abi.h>

static int fd;
static int n_test, n_fail;
static long page;

static void result(int ok, const char *fmt, ...)
{
	va_list ap;

	n_test++;
	if (!ok)
		n_fail++;
	printf("%s %d ", ok ? "ok" : "not ok", n_test);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* One legacy write() command: header, core command, driver data. */
static int uverbs_cmd(__u32 command, void *cmd, size_t cmd_len,
		      const void *drv_in, size_t drv_in_len, size_t resp_len)
{
	char buf[1024];
	struct ib_uverbs_cmd_hdr *hdr = (void *)buf;
	size_t len = sizeof(*hdr) + cmd_len + drv_in_len;

	if (len % 4 || resp_len % 4 || len > sizeof(buf))
		abort();
	hdr->command = command;
	hdr->in_words = len / 4;
	hdr->out_words = resp_len / 4;
	memcpy(buf + sizeof(*hdr), cmd, cmd_len);
	if (drv_in_len)
		memcpy(buf + sizeof(*hdr) + cmd_len, drv_in, drv_in_len);
	if (write(fd, buf, len) != (ssize_t)len)
		return -errno;
	return 0;
}

struct ctx_resp {
	struct ib_uverbs_get_context_resp core;
	struct vstellar_alloc_ucontext_resp drv;
};

struct cq_resp {
	struct ib_uverbs_create_cq_resp core;
	struct vstellar_create_cq_resp drv;
};

struct qp_resp {
	struct ib_uverbs_create_qp_resp core;
	struct vstellar_create_qp_resp drv;
};

struct srq_resp {
	struct ib_uverbs_create_srq_resp core;
	struct vstellar_create_srq_resp drv;
};

static void *ring(size_t size)
{
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap ring");
		exit(1);
	}
	return p;
}

static int comp_channel = -1;
static int chan_fd = -1;

static int create_cq(__u64 buf, __u32 log_cqe, int cqe, int with_drv,
		     struct cq_resp *r)
{
	struct ib_uverbs_create_cq cmd = {
		.response = (uintptr_t)r, .user_handle = 1, .cqe = cqe,
		.comp_channel = comp_channel,
	};
	struct vstellar_create_cq drv = { .buf_addr = buf, .log_cqe = log_cqe };

	memset(r, 0, sizeof(*r));
	return uverbs_cmd(IB_USER_VERBS_CMD_CREATE_CQ, &cmd, sizeof(cmd),
			  &drv, with_drv ? sizeof(drv) : 0, sizeof(*r));
}

static int destroy_cq(__u32 handle)
{
	struct ib_uverbs_destroy_cq_resp r;
	struct ib_uverbs_destroy_cq cmd = {
		.response = (uintptr_t)&r, .cq_handle = handle,
	};

	return uverbs_cmd(IB_USER_VERBS_CMD_DESTROY_CQ, &cmd, sizeof(cmd),
			  NULL, 0, sizeof(r));
}

static int create_qp(__u32 pd, __u32 cq, struct vstellar_create_qp *drv,
		     struct qp_resp *r)
{
	struct ib_uverbs_create_qp cmd = {
		.response = (uintptr_t)r, .user_handle = 2, .pd_handle = pd,
		.send_cq_handle = cq, .recv_cq_handle = cq,
		.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
		.max_recv_sge = 1, .qp_type = VSTELLAR_QPT_RC,
	};

	memset(r, 0, sizeof(*r));
	return uverbs_cmd(IB_USER_VERBS_CMD_CREATE_QP, &cmd, sizeof(cmd),
			  drv, sizeof(*drv), sizeof(*r));
}

static int destroy_qp(__u32 handle)
{
	struct ib_uverbs_destroy_qp_resp r;
	struct ib_uverbs_destroy_qp cmd = {
		.response = (uintptr_t)&r, .qp_handle = handle,
	};

	return uverbs_cmd(IB_USER_VERBS_CMD_DESTROY_QP, &cmd, sizeof(cmd),
			  NULL, 0, sizeof(r));
}

static int create_srq(__u32 pd, __u32 max_wr, __u32 max_sge, __u32 limit,
		      struct vstellar_create_srq *drv, struct srq_resp *r)
{
	struct ib_uverbs_create_srq cmd = {
		.response = (uintptr_t)r, .user_handle = 3, .pd_handle = pd,
		.max_wr = max_wr, .max_sge = max_sge, .srq_limit = limit,
	};

	memset(r, 0, sizeof(*r));
	return uverbs_cmd(IB_USER_VERBS_CMD_CREATE_SRQ, &cmd, sizeof(cmd),
			  drv, sizeof(*drv), sizeof(*r));
}

static int modify_srq(__u32 handle, __u32 attr_mask, __u32 max_wr,
		      __u32 limit)
{
	struct ib_uverbs_modify_srq cmd = {
		.srq_handle = handle, .attr_mask = attr_mask,
		.max_wr = max_wr, .srq_limit = limit,
	};

	return uverbs_cmd(IB_USER_VERBS_CMD_MODIFY_SRQ, &cmd, sizeof(cmd),
			  NULL, 0, 0);
}

static int query_srq(__u32 handle, struct ib_uverbs_query_srq_resp *r)
{
	struct ib_uverbs_query_srq cmd = {
		.response = (uintptr_t)r, .srq_handle = handle,
	};

	memset(r, 0, sizeof(*r));
	return uverbs_cmd(IB_USER_VERBS_CMD_QUERY_SRQ, &cmd, sizeof(cmd),
			  NULL, 0, sizeof(*r));
}

static int destroy_srq(__u32 handle)
{
	struct ib_uverbs_destroy_srq_resp r;
	struct ib_uverbs_destroy_srq cmd = {
		.response = (uintptr_t)&r, .srq_handle = handle,
	};

	return uverbs_cmd(IB_USER_VERBS_CMD_DESTROY_SRQ, &cmd, sizeof(cmd),
			  NULL, 0, sizeof(r));
}

static int modify_qp(struct ib_uverbs_modify_qp *m)
{
	return uverbs_cmd(IB_USER_VERBS_CMD_MODIFY_QP, m, sizeof(*m),
			  NULL, 0, 0);
}

static int query_qp_state(__u32 handle)
{
	struct ib_uverbs_query_qp_resp r;
	struct ib_uverbs_query_qp cmd = {
		.response = (uintptr_t)&r, .qp_handle = handle,
		.attr_mask = 1,
	};
	int err;

	err = uverbs_cmd(IB_USER_VERBS_CMD_QUERY_QP, &cmd, sizeof(cmd),
			 NULL, 0, sizeof(r));
	return err ? err : r.qp_state;
}

static int wait_readable(int efd, int ms)
{
	struct pollfd pfd = { .fd = efd, .events = POLLIN };

	return poll(&pfd, 1, ms) == 1;
}

/*
 * The data path without the provider: arm the CQ, post one RDMA WRITE
 * whose SGE has a bad lkey, ring the doorbell. The device must complete
 * it with an error CQE, notify the armed CQ (completion channel event:
 * CQ notification queue -> comp_handler) and report QP_ACCESS_ERR
 * (event queue -> QP event handler -> async fd).
 */
static void bad_lkey_write(void *db, void *kick, void *sq, void *cqbuf,
			   struct cq_resp *cq, struct qp_resp *qp, int async_fd,
			   __u64 addr, __u32 rkey)
{
	volatile struct vstellar_db_page_hdr *hdr = db;
	volatile struct vstellar_db_cq *dcq =
		(void *)((char *)db + VSTELLAR_DB_SLOT_SIZE * cq->drv.db_slot);
	volatile struct vstellar_db_qp *dqp =
		(void *)((char *)db + VSTELLAR_DB_SLOT_SIZE * qp->drv.db_slot);
	volatile struct vstellar_cqe *cqe = cqbuf;
	struct vstellar_send_wqe *w = sq;
	struct vstellar_sge *sge = (void *)(w + 1);
	struct ib_uverbs_comp_event_desc ce;
	struct ib_uverbs_async_event_desc ae;
	int i, got;

	memset(w, 0, 128);
	w->wr_id = 0x1234;
	w->opcode = VSTELLAR_WR_RDMA_WRITE;
	w->flags = VSTELLAR_WQE_SIGNALED;
	w->num_sge = 1;
	w->u.rdma.remote_addr = addr;
	w->u.rdma.rkey = rkey;
	sge->addr = addr;
	sge->length = 64;
	sge->lkey = 0xdead00;
	dcq->arm = 1;
	__sync_synchronize();
	dqp->sq_pi = 1;
	__sync_synchronize();
	if (hdr->need_kick && kick != MAP_FAILED)
		*(volatile __u32 *)kick = 1;

	for (i = 0; i < 500 && !(cqe->owner & VSTELLAR_CQE_OWNER); i++)
		usleep(10000);
	__sync_synchronize();
	result((cqe->owner & VSTELLAR_CQE_OWNER) && cqe->wr_id == 0x1234 &&
	       cqe->status != 0 && cqe->qpn == qp->core.qpn,
	       "bad-lkey RDMA WRITE completes in error (owner %u, wr_id %#llx, status %u)",
	       cqe->owner, (unsigned long long)cqe->wr_id, cqe->status);

	got = wait_readable(chan_fd, 5000) &&
	      read(chan_fd, &ce, sizeof(ce)) == sizeof(ce);
	result(got && ce.cq_handle == 1,
	       "armed CQ raised a completion event (CQ notification queue)");
	got = wait_readable(async_fd, 5000) &&
	      read(async_fd, &ae, sizeof(ae)) == sizeof(ae);
	result(got && ae.event_type == 3 /* IB_EVENT_QP_ACCESS_ERR */ &&
	       ae.element == 2,
	       "QP_ACCESS_ERR async event for the QP (event %u)",
	       got ? ae.event_type : 0);
	result(query_qp_state(qp->core.qp_handle) == VSTELLAR_QPS_ERR,
	       "QP is in ERR");
}

/*
 * Shared receive queues (F_SRQ): the device limits, an SRQ of 16 WQEs of
 * one SGE (slots of 16 + 16 bytes, like an RQ), its limit armed and
 * queried, an RC QP on it, and what the driver must refuse.
 */
static void srq_tests(__u32 pd, __u32 cq, __u32 features)
{
	struct ib_uverbs_query_device_resp qd;
	struct ib_uverbs_query_device qdc = { .response = (uintptr_t)&qd };
	struct ib_uverbs_query_srq_resp qs;
	struct vstellar_create_srq drv;
	struct vstellar_create_qp qdrv;
	struct srq_resp srq, bad;
	struct qp_resp qp;
	void *rq = ring(16 * 32), *sq = ring(16 * 128);
	int err, qp_err, ok, has_srq = !!(features & (1u << VIRTIO_VSTELLAR_F_SRQ));

	memset(&qd, 0, sizeof(qd));
	err = uverbs_cmd(IB_USER_VERBS_CMD_QUERY_DEVICE, &qdc, sizeof(qdc),
			 NULL, 0, sizeof(qd));
	if (has_srq)
		ok = qd.max_srq && qd.max_srq_wr >= 16 && qd.max_srq_sge >= 1;
	else
		ok = !qd.max_srq && !qd.max_srq_wr && !qd.max_srq_sge;
	result(!err && ok,
	       "query_device SRQ limits match F_SRQ %d (max_srq %u, max_srq_wr %u, max_srq_sge %u)",
	       has_srq, qd.max_srq, qd.max_srq_wr, qd.max_srq_sge);

	memset(&drv, 0, sizeof(drv));
	drv.buf_addr = (uintptr_t)rq;
	drv.log_wqe = 4;
	drv.log_stride = 5;
	if (!has_srq) {
		err = create_srq(pd, 16, 1, 0, &drv, &srq);
		result(err == -EOPNOTSUPP, "create_srq without F_SRQ refused (err %d)",
		       err);
		printf("ok %d # SKIP no F_SRQ: no SRQ to test\n", ++n_test);
		return;
	}

	err = create_srq(pd, 16, 1, 0, &drv, &srq);
	result(!err && srq.core.max_wr == 16 && srq.core.max_sge == 1 &&
	       srq.drv.max_sge == 1 && srq.drv.db_slot >= VSTELLAR_DB_FIRST_SLOT,
	       "create_srq of 16 (err %d, srqn %u, slot %u, max_wr %u, max_sge %u)",
	       err, srq.drv.srqn, srq.drv.db_slot, srq.core.max_wr,
	       srq.core.max_sge);
	if (err)
		return;

	err = modify_srq(srq.core.srq_handle, 1 << 1 /* IB_SRQ_LIMIT */, 0, 4);
	result(!err, "modify_srq arms the limit at 4 (err %d)", err);
	err = query_srq(srq.core.srq_handle, &qs);
	result(!err && qs.max_wr == 16 && qs.max_sge == 1 && qs.srq_limit == 4,
	       "query_srq (err %d, max_wr %u, max_sge %u, limit %u)", err,
	       qs.max_wr, qs.max_sge, qs.srq_limit);
	/* resizing (F_RESIZE_SRQ) needs the new ring in the driver data */
	err = modify_srq(srq.core.srq_handle, 1 << 0 /* IB_SRQ_MAX_WR */, 32, 0);
	result(err == -EINVAL, "modify_srq resizing without a ring refused (err %d)", err);
	err = modify_srq(srq.core.srq_handle, 1 << 1, 0, 16);
	result(err == -EINVAL, "modify_srq limit of max_wr refused (err %d)", err);

	/* an RC QP on the SRQ: no RQ of its own, so its RQ fields are 0 */
	memset(&qdrv, 0, sizeof(qdrv));
	qdrv.sq_buf_addr = (uintptr_t)sq;
	qdrv.sq_log_wqe = 4;
	qdrv.sq_log_stride = 7;
	{
		struct ib_uverbs_create_qp cmd = {
			.response = (uintptr_t)&qp, .user_handle = 4,
			.pd_handle = pd, .send_cq_handle = cq,
			.recv_cq_handle = cq, .srq_handle = srq.core.srq_handle,
			.max_send_wr = 16, .max_send_sge = 1,
			.qp_type = VSTELLAR_QPT_RC, .is_srq = 1,
		};

		qdrv.rq_log_wqe = 4;
		memset(&qp, 0, sizeof(qp));
		err = uverbs_cmd(IB_USER_VERBS_CMD_CREATE_QP, &cmd, sizeof(cmd),
				 &qdrv, sizeof(qdrv), sizeof(qp));
		result(err == -EINVAL,
		       "create_qp on an SRQ with an RQ size refused (err %d)", err);
		qdrv.rq_log_wqe = 0;
		memset(&qp, 0, sizeof(qp));
		qp_err = uverbs_cmd(IB_USER_VERBS_CMD_CREATE_QP, &cmd,
				    sizeof(cmd), &qdrv, sizeof(qdrv),
				    sizeof(qp));
		result(!qp_err && qp.core.qpn == qp.drv.qpn &&
		       !qp.core.max_recv_wr && !qp.core.max_recv_sge,
		       "create_qp RC on the SRQ (err %d, qpn %u, recv_wr %u, recv_sge %u)",
		       qp_err, qp.drv.qpn, qp.core.max_recv_wr,
		       qp.core.max_recv_sge);
	}
	if (qp_err) {
		printf("ok %d # SKIP no QP on the SRQ\n", ++n_test);
		printf("ok %d # SKIP no QP on the SRQ\n", ++n_test);
	} else {
		err = destroy_srq(srq.core.srq_handle);
		result(err == -EBUSY,
		       "destroy_srq of an SRQ in use refused (err %d)", err);
		err = destroy_qp(qp.core.qp_handle);
		result(!err, "destroy_qp on the SRQ (err %d)", err);
	}

	/* hostile sizes: each refused, nothing created */
	drv.comp_mask = 1;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EINVAL, "create_srq with a comp_mask refused (err %d)", err);
	drv.comp_mask = 0;
	drv.log_wqe = 2;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EINVAL, "create_srq with a ring smaller than max_wr refused (err %d)",
	       err);
	drv.log_wqe = 31;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EINVAL, "create_srq with log_wqe 31 refused (err %d)", err);
	drv.log_wqe = 4;
	drv.log_stride = 3;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EINVAL, "create_srq with an 8-byte stride refused (err %d)", err);
	drv.log_stride = 4;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EINVAL, "create_srq whose slot cannot hold its SGE refused (err %d)",
	       err);
	drv.log_stride = 5;
	err = create_srq(pd, 16, 1, 16, &drv, &bad);
	result(err == -EINVAL, "create_srq with a limit of max_wr refused (err %d)", err);
	drv.buf_addr = (uintptr_t)rq + 8;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EINVAL, "create_srq with an unaligned ring refused (err %d)", err);
	drv.buf_addr = 0x10000;
	err = create_srq(pd, 16, 1, 0, &drv, &bad);
	result(err == -EFAULT, "create_srq with an unmapped ring refused (err %d)", err);

	err = destroy_srq(srq.core.srq_handle);
	result(!err, "destroy_srq (err %d)", err);
}

/* Index and bytes of the first IPv4-mapped GID of port 1, -1 if none. */
static int find_ipv4_gid(const char *ibdev, __u8 gid[16])
{
	char path[256], line[64];
	unsigned int w[8];
	int i, j;

	for (i = 0; i < 16; i++) {
		FILE *f;

		snprintf(path, sizeof(path),
			 "/sys/class/infiniband/%s/ports/1/gids/%d", ibdev, i);
		f = fopen(path, "r");
		if (!f)
			return -1;
		if (!fgets(line, sizeof(line), f) ||
		    sscanf(line, "%x:%x:%x:%x:%x:%x:%x:%x", &w[0], &w[1], &w[2],
			   &w[3], &w[4], &w[5], &w[6], &w[7]) != 8) {
			fclose(f);
			continue;
		}
		fclose(f);
		if (w[0] || w[1] || w[2] || w[3] || w[4] || w[5] != 0xffff)
			continue;
		for (j = 0; j < 8; j++) {
			gid[2 * j] = w[j] >> 8;
			gid[2 * j + 1] = w[j] & 0xff;
		}
		return i;
	}
	return -1;
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "/dev/infiniband/uverbs0";
	const char *ibdev = argc > 2 ? argv[2] : "vstellar0";
	struct ib_uverbs_get_context gc;
	struct ib_uverbs_alloc_pd apd;
	struct ib_uverbs_alloc_pd_resp pdr;
	struct ib_uverbs_reg_mr rm;
	struct ib_uverbs_reg_mr_resp mrr;
	struct ib_uverbs_modify_qp m;
	struct vstellar_create_qp qdrv;
	struct ctx_resp cr;
	struct cq_resp cq, cq2;
	struct qp_resp qp, qp2;
	void *cqbuf, *sq, *rq, *mrbuf, *db, *p, *kick = MAP_FAILED;
	__u32 mr_rkey = 0;
	__u8 gid[16];
	int err, gidx;

	page = sysconf(_SC_PAGESIZE);
	printf("TAP version 13\n");
	fd = open(path, O_RDWR);
	if (fd < 0) {
		printf("1..0 # SKIP cannot open %s: %s\n", path, strerror(errno));
		return 4;
	}

	/* context */
	memset(&cr, 0, sizeof(cr));
	gc.response = (uintptr_t)&cr;
	err = uverbs_cmd(IB_USER_VERBS_CMD_GET_CONTEXT, &gc, sizeof(gc),
			 NULL, 0, sizeof(cr));
	result(!err && cr.drv.ucontext && cr.drv.db_page_size == 4096,
	       "get_context (err %d, ucontext %u, db key %#llx, kick key %#llx, features %#x)",
	       err, cr.drv.ucontext, (unsigned long long)cr.drv.db_mmap_key,
	       (unsigned long long)cr.drv.kick_mmap_key, cr.drv.device_features);
	if (err) {
		printf("1..%d\n", n_test);
		return 1;
	}

	db = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		  cr.drv.db_mmap_key);
	result(db != MAP_FAILED, "mmap doorbell page");
	if (db != MAP_FAILED) {
		volatile __u32 *need_kick = db;

		result(*need_kick <= 1, "doorbell page readable (need_kick %u)",
		       *need_kick);
	}
	if (cr.drv.comp_mask & VSTELLAR_UCTX_KICK_PAGE) {
		kick = mmap(NULL, page, PROT_WRITE, MAP_SHARED, fd,
			    cr.drv.kick_mmap_key);
		result(kick != MAP_FAILED, "mmap kick page");
	} else {
		printf("ok %d # SKIP no kick page\n", ++n_test);
	}
	p = mmap(NULL, page, PROT_READ, MAP_PRIVATE, fd, cr.drv.db_mmap_key);
	result(p == MAP_FAILED, "private mapping of the doorbell page refused");
	p = mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, fd, cr.drv.db_mmap_key);
	result(p == MAP_FAILED, "two-page mapping of the doorbell page refused");
	p = mmap(NULL, page, PROT_READ, MAP_SHARED, fd, 0x7000000);
	result(p == MAP_FAILED, "mapping at an unknown offset refused");

	/* PD */
	apd.response = (uintptr_t)&pdr;
	err = uverbs_cmd(IB_USER_VERBS_CMD_ALLOC_PD, &apd, sizeof(apd),
			 NULL, 0, sizeof(pdr));
	result(!err, "alloc_pd (err %d)", err);

	/* MR */
	mrbuf = ring(1 << 20);
	memset(&rm, 0, sizeof(rm));
	rm.response = (uintptr_t)&mrr;
	rm.start = (uintptr_t)mrbuf;
	rm.length = 1 << 20;
	rm.hca_va = (uintptr_t)mrbuf;
	rm.pd_handle = pdr.pd_handle;
	rm.access_flags = VSTELLAR_ACCESS_LOCAL_WRITE | VSTELLAR_ACCESS_REMOTE_WRITE |
			  VSTELLAR_ACCESS_REMOTE_READ;
	err = uverbs_cmd(IB_USER_VERBS_CMD_REG_MR, &rm, sizeof(rm), NULL, 0,
			 sizeof(mrr));
	result(!err && mrr.lkey, "reg_mr 1 MiB (err %d, lkey %#x, rkey %#x)",
	       err, mrr.lkey, mrr.rkey);
	mr_rkey = mrr.rkey;
	rm.length = 0;
	err = uverbs_cmd(IB_USER_VERBS_CMD_REG_MR, &rm, sizeof(rm), NULL, 0,
			 sizeof(mrr));
	result(err == -EINVAL, "reg_mr of length 0 refused (err %d)", err);
	rm.start = rm.hca_va = 0x10000;
	rm.length = 1 << 20;
	err = uverbs_cmd(IB_USER_VERBS_CMD_REG_MR, &rm, sizeof(rm), NULL, 0,
			 sizeof(mrr));
	result(err == -EFAULT, "reg_mr of unmapped memory refused (err %d)", err);

	/* CQ, with a completion channel */
	{
		struct ib_uverbs_create_comp_channel_resp ccr;
		struct ib_uverbs_create_comp_channel cc = {
			.response = (uintptr_t)&ccr,
		};

		err = uverbs_cmd(IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL, &cc,
				 sizeof(cc), NULL, 0, sizeof(ccr));
		result(!err, "create_comp_channel (err %d)", err);
		chan_fd = comp_channel = err ? -1 : (int)ccr.fd;
	}
	cqbuf = ring(64 * sizeof(struct vstellar_cqe));
	err = create_cq((uintptr_t)cqbuf, 6, 63, 1, &cq);
	comp_channel = -1;
	result(!err && cq.drv.db_slot >= VSTELLAR_DB_FIRST_SLOT,
	       "create_cq of 64 (err %d, cqn %u, slot %u, cqe %u)", err,
	       cq.drv.cqn, cq.drv.db_slot, cq.core.cqe);
	err = create_cq((uintptr_t)cqbuf, 31, 63, 1, &cq2);
	result(err == -EINVAL, "create_cq with log_cqe 31 refused (err %d)", err);
	err = create_cq((uintptr_t)cqbuf, 4, 63, 1, &cq2);
	result(err == -EINVAL, "create_cq with a ring smaller than cqe refused (err %d)", err);
	err = create_cq((uintptr_t)cqbuf + 8, 6, 63, 1, &cq2);
	result(err == -EINVAL, "create_cq with an unaligned ring refused (err %d)", err);
	err = create_cq(0x10000, 6, 63, 1, &cq2);
	result(err == -EFAULT, "create_cq with an unmapped ring refused (err %d)", err);
	err = create_cq((uintptr_t)cqbuf, 6, 63, 0, &cq2);
	result(err == -EINVAL, "create_cq without driver data refused (err %d)", err);

	/* QP */
	/* slots hold a WQE header and one SGE: 64 + 16 and 16 + 16 bytes */
	sq = ring(16 * 128);
	rq = ring(16 * 32);
	memset(&qdrv, 0, sizeof(qdrv));
	qdrv.sq_buf_addr = (uintptr_t)sq;
	qdrv.rq_buf_addr = (uintptr_t)rq;
	qdrv.sq_log_wqe = 4;
	qdrv.sq_log_stride = 7;
	qdrv.rq_log_wqe = 4;
	qdrv.rq_log_stride = 5;
	err = create_qp(pdr.pd_handle, cq.core.cq_handle, &qdrv, &qp);
	result(!err && qp.core.qpn == qp.drv.qpn,
	       "create_qp RC (err %d, qpn %u, slot %u, send_sge %u)", err,
	       qp.drv.qpn, qp.drv.db_slot, qp.core.max_send_sge);

	memset(&m, 0, sizeof(m));
	m.qp_handle = qp.core.qp_handle;
	m.attr_mask = VSTELLAR_QP_STATE | VSTELLAR_QP_PKEY_INDEX | VSTELLAR_QP_PORT |
		      VSTELLAR_QP_ACCESS_FLAGS;
	m.qp_state = VSTELLAR_QPS_INIT;
	m.port_num = 1;
	m.qp_access_flags = VSTELLAR_ACCESS_REMOTE_WRITE | VSTELLAR_ACCESS_REMOTE_READ;
	err = modify_qp(&m);
	result(!err && query_qp_state(qp.core.qp_handle) == VSTELLAR_QPS_INIT,
	       "modify_qp RESET -> INIT (err %d)", err);

	gidx = find_ipv4_gid(ibdev, gid);
	if (gidx < 0) {
		/* no net device with an IPv4 address: nothing to connect to */
		for (int i = 0; i < 3; i++)
			printf("ok %d # SKIP no IPv4 GID for RTR/RTS\n", ++n_test);
		for (int i = 0; i < 4; i++)
			printf("ok %d # SKIP no QP in RTS for the data path\n", ++n_test);
	} else {
		memset(&m, 0, sizeof(m));
		m.qp_handle = qp.core.qp_handle;
		m.attr_mask = VSTELLAR_QP_STATE | VSTELLAR_QP_AV | VSTELLAR_QP_PATH_MTU |
			      VSTELLAR_QP_DEST_QPN | VSTELLAR_QP_RQ_PSN |
			      VSTELLAR_QP_MAX_DEST_RD_ATOMIC | VSTELLAR_QP_MIN_RNR_TIMER;
		m.qp_state = VSTELLAR_QPS_RTR;
		m.path_mtu = 3 /* IB_MTU_1024 */;
		m.dest_qp_num = qp.core.qpn;
		m.rq_psn = 0x123;
		m.max_dest_rd_atomic = 1;
		m.min_rnr_timer = 12;
		m.dest.is_global = 1;
		m.dest.port_num = 1;
		m.dest.hop_limit = 64;
		m.dest.sgid_index = gidx;
		memcpy(m.dest.dgid, gid, 16);
		err = modify_qp(&m);
		result(!err && query_qp_state(qp.core.qp_handle) == VSTELLAR_QPS_RTR,
		       "modify_qp INIT -> RTR to itself over GID %d (err %d)", gidx, err);

		memset(&m, 0, sizeof(m));
		m.qp_handle = qp.core.qp_handle;
		m.attr_mask = VSTELLAR_QP_STATE | VSTELLAR_QP_TIMEOUT | VSTELLAR_QP_RETRY_CNT |
			      VSTELLAR_QP_RNR_RETRY | VSTELLAR_QP_SQ_PSN | VSTELLAR_QP_MAX_QP_RD_ATOMIC;
		m.qp_state = VSTELLAR_QPS_RTS;
		m.timeout = 14;
		m.retry_cnt = 7;
		m.rnr_retry = 7;
		m.sq_psn = 0x123;
		m.max_rd_atomic = 1;
		err = modify_qp(&m);
		result(!err && query_qp_state(qp.core.qp_handle) == VSTELLAR_QPS_RTS,
		       "modify_qp RTR -> RTS (err %d)", err);
		if (!err && db != MAP_FAILED)
			bad_lkey_write(db, kick, sq, cqbuf, &cq, &qp,
				       cr.core.async_fd, (uintptr_t)mrbuf, mr_rkey);

		memset(&m, 0, sizeof(m));
		m.qp_handle = qp.core.qp_handle;
		m.attr_mask = VSTELLAR_QP_STATE;
		m.qp_state = VSTELLAR_QPS_INIT;
		err = modify_qp(&m);
		result(err == -EINVAL, "modify_qp RTS -> INIT refused (err %d)", err);
	}

	qdrv.sq_log_stride = 5;
	err = create_qp(pdr.pd_handle, cq.core.cq_handle, &qdrv, &qp2);
	result(err == -EINVAL, "create_qp with a 32-byte SQ stride refused (err %d)", err);
	qdrv.sq_log_stride = 7;
	qdrv.sq_log_wqe = 2;
	err = create_qp(pdr.pd_handle, cq.core.cq_handle, &qdrv, &qp2);
	result(err == -EINVAL, "create_qp with an SQ smaller than max_send_wr refused (err %d)", err);

	srq_tests(pdr.pd_handle, cq.core.cq_handle, cr.drv.device_features);

	err = destroy_cq(cq.core.cq_handle);
	result(err == -EBUSY, "destroy_cq of a CQ in use refused (err %d)", err);

	/* Teardown: QP, CQ; the MR and PD are left to close() on purpose */
	err = destroy_qp(qp.core.qp_handle);
	result(!err, "destroy_qp (err %d)", err);
	err = destroy_cq(cq.core.cq_handle);
	result(!err, "destroy_cq (err %d)", err);
	if (db != MAP_FAILED)
		munmap(db, page);
	result(!close(fd), "close with a PD and an MR still open");

	printf("1..%d\n", n_test);
	printf("# totals: %d tests, %d failed\n", n_test, n_fail);
	return n_fail ? 1 : 0;
}
