// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar kernel rings: the CQE, SQ and RQ rings of kernel CQs and QPs,
 * one DMA-coherent buffer each. Kernel verbs create them and run the data
 * path on them; destroying a CQ or QP (the same verb for user and kernel
 * objects) frees them, and a modify to RESET restarts their indices.
 */
#include <linux/dma-mapping.h>

#include "vstellar.h"

int vstellar_kring_alloc(struct vstellar_dev *dev, struct vstellar_kring *r,
			 size_t size)
{
	r->size = PAGE_ALIGN(size);
	r->buf = dma_alloc_coherent(vstellar_dma_device(dev->vdev), r->size,
				    &r->dma, GFP_KERNEL);
	return r->buf ? 0 : -ENOMEM;
}

/* Frees @r if it was allocated: a no-op for user CQs and QPs. */
void vstellar_kring_free(struct vstellar_dev *dev, struct vstellar_kring *r)
{
	if (r->buf)
		dma_free_coherent(vstellar_dma_device(dev->vdev), r->size,
				  r->buf, r->dma);
	r->buf = NULL;
}

/* RESET forgets every WQE, on both sides: indices restart at 0. */
void vstellar_kqp_reset(struct vstellar_qp *qp)
{
	qp->sq_pi = 0;
	qp->rq_pi = 0;
	WRITE_ONCE(qp->sq_done, 0);
	WRITE_ONCE(qp->rq_done, 0);
}
