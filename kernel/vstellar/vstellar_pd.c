// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar protection domains: a device object each (ALLOC_PD), in the
 * caller's user context or the kernel's (0).
 */
#include "vstellar.h"

int vstellar_alloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	return vstellar_cmd_alloc_pd(to_vdev(ibpd->device),
				     vstellar_uctx_handle(udata),
				     &to_vpd(ibpd)->pdn);
}

int vstellar_dealloc_pd(struct ib_pd *ibpd, struct ib_udata *udata)
{
	return vstellar_cmd_dealloc_pd(to_vdev(ibpd->device),
				       vstellar_uctx_handle(udata),
				       to_vpd(ibpd)->pdn);
}
