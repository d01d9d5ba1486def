// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/*
 * vStellar address handles (F_UD): the device keeps none, so no command.
 */
#include "vstellar.h"

int vstellar_create_ah(struct ib_ah *ibah, struct rdma_ah_init_attr *init_attr,
		       struct ib_udata *udata)
{
	struct rdma_ah_attr *ah_attr = init_attr->ah_attr;

	/*
	 * The device keeps no AHs: UD WQEs carry the address vector, which
	 * the provider builds itself for user AHs. So no command, and kernel
	 * callers in atomic context are served too.
	 */
	if (!(to_vdev(ibah->device)->features & BIT(VIRTIO_VSTELLAR_F_UD)))
		return -EOPNOTSUPP;
	if (!(rdma_ah_get_ah_flags(ah_attr) & IB_AH_GRH))
		return -EINVAL;
	vstellar_av_from_ah_attr(&to_vah(ibah)->av, ah_attr);
	return 0;
}

int vstellar_destroy_ah(struct ib_ah *ibah, u32 flags)
{
	return 0;
}
