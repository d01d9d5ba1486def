// The whole vStellar device; see include/vstellard/device_state.h.
#include "vstellard/device_state.h"

#include <endian.h>

#include <cstring>

namespace vstellard {

DeviceConfig DeviceConfig::Default() {
  // Ring sizes a guest may ask for: within the interface's ring limits, so
  // every layer's bounds hold for this device (virtio_vstellar.h).
  // max_cqe: a CQ's ring is guest memory and the engine only stages its
  // completions (see CREATE_CQ), so the guest may size it like a hardware
  // NIC's: libfabric's rxm asks for its rx + tx sizes times the universe
  // size (98,688 CQEs with its defaults).
  constexpr uint32_t kMaxQpWr = 4096, kMaxCqe = 1u << VSTELLAR_MAX_LOG_CQE;
  static_assert(kMaxQpWr <= (1u << VSTELLAR_MAX_LOG_WQE), "max_qp_wr over VSTELLAR_MAX_LOG_WQE");
  static_assert(kMaxCqe <= (1u << VSTELLAR_MAX_LOG_CQE), "max_cqe over VSTELLAR_MAX_LOG_CQE");
  DeviceConfig d;
  virtio_vstellar_config& c = d.config;
  c.abi_version = htole32(VSTELLAR_ABI_VERSION);
  c.num_cq_queues = htole32(1);
  const uint8_t guid[8] = {0x02, 0x00, 0x5e, 0xff, 0xfe, 0x00, 0x00, 0x01};
  std::memcpy(c.node_guid, guid, sizeof(guid));
  c.page_size_cap = htole64(Bit(12) | Bit(21));
  c.max_mr_size = htole64(uint64_t{1} << 40);
  c.max_ucontext = htole32(64);
  c.max_pd = htole32(1024);
  c.max_qp = htole32(1024);
  c.max_qp_wr = htole32(kMaxQpWr);
  c.max_send_sge = htole32(8);
  c.max_recv_sge = htole32(8);
  c.max_inline_data = htole32(256);
  c.max_cq = htole32(1024);
  c.max_cqe = htole32(kMaxCqe);
  c.max_mr = htole32(4096);
  c.max_ah = htole32(1024);
  c.max_qp_rd_atom = htole32(16);
  c.max_qp_init_rd_atom = htole32(16);
  c.max_cmd_pages = htole32(65536);
  c.max_msg_size = htole32(1u << 31);
  c.gid_table_len = htole32(16);
  c.db_page_size = htole32(VSTELLAR_DB_PAGE_SIZE);
  c.db_slots = htole32(VSTELLAR_DB_SLOTS_PER_PAGE);
  c.max_fast_reg_pages = htole32(512);  // 2 MiB of 4 KiB pages per registration, as rxe
  d.device_features = Bit(VIRTIO_VSTELLAR_F_RC) | Bit(VIRTIO_VSTELLAR_F_UD) | Bit(VIRTIO_VSTELLAR_F_DB_SUPPRESS) |
                      Bit(VIRTIO_VSTELLAR_F_INLINE) | Bit(VIRTIO_VSTELLAR_F_ATOMIC) | Bit(VIRTIO_VSTELLAR_F_SRQ) |
                      Bit(VIRTIO_VSTELLAR_F_MEM_MGT) | Bit(VIRTIO_VSTELLAR_F_MW) |
                      Bit(VIRTIO_VSTELLAR_F_UC) | Bit(VIRTIO_VSTELLAR_F_RESIZE_CQ) | Bit(VIRTIO_VSTELLAR_F_MCAST) |
                      Bit(VIRTIO_VSTELLAR_F_RESIZE_SRQ) | Bit(VIRTIO_VSTELLAR_F_DMABUF) |
                      Bit(VIRTIO_VSTELLAR_F_ODP);
  return d;
}

}  // namespace vstellard
