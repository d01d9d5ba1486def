// A host test frontend for vstellard: it plays QEMU (vhost-user over a unix
// socket, memfd "guest memory" handed over with SET_MEM_TABLE, vrings,
// kick and call eventfds) and a guest driver (split virtqueues, control
// commands). Tests and the benchmark use it; nothing here trusts vstellard
// and nothing in vstellard trusts it.
//
// Guest-physical layout it uses (all inside the first 2 MiB block):
//   queue q's ring at 0x10000 * (q + 1): descriptors, avail at +0x1000,
//   used at +0x2000 (so up to 256 entries); control requests at 0x100000,
//   responses at 0x1f0000, event buffers at 0x1f8000, CQ notification
//   buffers at 0x1fc000. Memory from 2 MiB on is free for tests.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <vstellar/virtio_vstellar.h>

#include "vstellard/vhost_user.h"

namespace vstellard {

struct FrontendOptions {
  uint64_t mem_size = 64ull << 20;
  bool doorbell = true;       // a 64 KiB "vstellar-doorbell" memfd region
  // As QEMU since interface 1.4: the memfd is "vstellar-doorbell-<id>" and
  // SET_CONFIG gives the id; 0: the bare name, no SET_CONFIG.
  uint32_t db_region_id = 0;
  uint64_t doorbell_gpa = 0;  // 0: 0xfe000000, or above RAM
  bool sealable_doorbell = true;  // its memfd allows seals (QEMU's does)
  uint32_t ring_num = 64;
  uint32_t cq_queues = 1;
  bool event_idx = false;     // negotiate VIRTIO_RING_F_EVENT_IDX
  // Negotiate what QEMU's live migration needs (LOG_SHMFD, RESET_DEVICE,
  // DEVICE_STATE): GET_VRING_BASE then stops the device instead of
  // resetting it.
  bool migratable = false;
};

struct CmdResult {
  bool done = false;          // the device returned the chain
  uint32_t used_len = 0;
  vstellar_resp_hdr hdr{};
  std::vector<uint8_t> body;
  uint16_t status() const { return hdr.status; }
};

// Command bodies as the guest driver builds them, for tests and the
// benchmark. Guest-physical pages are 4 KiB and listed one by one.
//
// A command's fixed body followed by its page list (8 bytes a page), as
// CREATE_CQ, CREATE_QP, CREATE_SRQ, REG_MR and the RESIZEs carry it.
std::vector<uint8_t> WithPages(const void* body, size_t n, const std::vector<uint64_t>& pages);
template <typename T>
std::vector<uint8_t> WithPages(const T& body, const std::vector<uint64_t>& pages) {
  return WithPages(&body, sizeof(T), pages);
}
// The `n` contiguous pages from `gpa` on.
std::vector<uint64_t> PagesFrom(uint64_t gpa, uint64_t n);
// CREATE_CQ of 1 << log_cqe CQEs whose ring is the contiguous pages at `gpa`.
std::vector<uint8_t> CreateCqBody(uint32_t log_cqe, uint64_t gpa);
// REG_MR of the `len` bytes at `gpa` (iova == gpa) with `access`.
std::vector<uint8_t> RegMrBody(uint32_t pdn, uint64_t gpa, uint64_t len, uint32_t access);
// CREATE_QP's fixed body for an RC QP whose send and receive CQ is `cqn`:
// 64 SQ slots of 128 bytes (2 pages), then 64 RQ slots of 64 bytes (1
// page); 4 send and 2 receive SGEs, 64 bytes of inline data.
vstellar_cmd_create_qp RcQpBody(uint32_t pdn, uint32_t cqn);
// ... with its page list: the SQ's and then the RQ's pages, from `ring` on.
std::vector<uint8_t> CreateQpBody(const vstellar_cmd_create_qp& c, uint64_t ring);

// MODIFY_QP's body with what an RC connection to QP `dest` on 127.0.0.1
// needs (timeouts, retries, 4 RDMA reads each way, all access); the caller
// sets qp_state and attr_mask. Tests and the benchmark drive QPs with it.
vstellar_cmd_modify_qp RcModifyBody(uint32_t qpn, uint32_t dest, uint8_t path_mtu);
// The attributes MODIFY_QP needs for RESET->INIT, INIT->RTR and RTR->RTS.
constexpr uint32_t kRcInitMask = VSTELLAR_QP_STATE | VSTELLAR_QP_PKEY_INDEX | VSTELLAR_QP_PORT | VSTELLAR_QP_ACCESS_FLAGS;
constexpr uint32_t kRcRtrMask = VSTELLAR_QP_STATE | VSTELLAR_QP_AV | VSTELLAR_QP_PATH_MTU | VSTELLAR_QP_DEST_QPN |
                                VSTELLAR_QP_RQ_PSN | VSTELLAR_QP_MAX_DEST_RD_ATOMIC | VSTELLAR_QP_MIN_RNR_TIMER;
constexpr uint32_t kRcRtsMask = VSTELLAR_QP_STATE | VSTELLAR_QP_TIMEOUT | VSTELLAR_QP_RETRY_CNT |
                                VSTELLAR_QP_RNR_RETRY | VSTELLAR_QP_SQ_PSN | VSTELLAR_QP_MAX_QP_RD_ATOMIC;

class Frontend {
 public:
  static constexpr uint64_t kVaBase = 0x7f0000000000ull;  // "QEMU's" address of gpa 0
  static constexpr uint64_t kReqGpa = 0x100000, kReqMax = 0xe0000;
  static constexpr uint64_t kRespGpa = 0x1f0000;
  static constexpr uint64_t kEventGpa = 0x1f8000, kCqnGpa = 0x1fc000;
  static constexpr uint32_t kEventBuf = sizeof(vstellar_event_page_fault);
  static constexpr uint64_t kFreeGpa = 0x200000;

  explicit Frontend(FrontendOptions o = {});
  ~Frontend();
  Frontend(const Frontend&) = delete;
  Frontend& operator=(const Frontend&) = delete;

  // Connects and negotiates; then SET_MEM_TABLE (acked) unless told not to.
  bool Connect(const std::string& socket, std::string* err, bool mem_table = true);
  bool SendMemTable(std::string* err);
  // A new connection for the same guest (its memory and rings kept), as
  // the destination QEMU of a migration makes: handshake and memory table.
  bool Reconnect(const std::string& socket, std::string* err);
  // Closes the connection (as a QEMU that exits after migrating away).
  void Disconnect();
  uint64_t features() const { return features_; }
  // Live migration, as QEMU does it: GET_VRING_BASE of every queue (the
  // device stops; the bases are kept), and later the same queues started
  // again from those bases (here or on a new connection).
  bool StopQueues(std::string* err);
  bool ResumeQueues(std::string* err);
  // Interrupts the device raised on queue q since the last call (its call
  // eventfd's count, read and reset).
  uint64_t TakeCalls(uint32_t q);
  // The device's state out (save) or in, through a pipe
  // (SET_DEVICE_STATE_FD, then CHECK_DEVICE_STATE).
  bool TransferState(bool save, std::vector<uint8_t>* bytes, std::string* err);
  // Puts another device's doorbell region into this one's memory table
  // (first, before our own), as QEMU does for two devices in one guest.
  void AddDoorbellOf(const Frontend& other) { others_.push_back(&other); }
  // Device memory of another PCI device of the guest (an accelerator's
  // BAR: docs/accelerator.md): `size` bytes of their own memfd at `gpa`,
  // put in the memory table by the next SendMemTable. Returns the memory as
  // the guest's CPU would see it through the BAR, or nullptr.
  uint8_t* AddDeviceMemory(uint64_t gpa, uint64_t size, std::string* err);
  // Sets up and starts control, event, kick and CQ notification queues;
  // posts event and CQ notification buffers.
  bool StartQueues(std::string* err);
  bool StartQueue(uint32_t q, uint32_t num, std::string* err);

  // One vhost-user message; with `ack`, waits for the REPLY_ACK.
  bool Send(Request r, const void* payload, size_t n, std::string* err, const std::vector<int>& fds = {},
            bool ack = false);
  // A request with a reply (GET_*): the reply's payload.
  bool Get(Request r, const void* payload, size_t n, std::vector<uint8_t>* reply, std::string* err,
           const std::vector<int>& fds = {});
  // Whether vstellard still has this connection open.
  bool Alive();

  uint8_t* mem() { return mem_; }
  uint64_t mem_size() const { return o_.mem_size; }
  uint64_t doorbell_gpa() const { return db_gpa_; }
  // The doorbell region (64 KiB = 16 pages) as the guest maps it; page i of
  // it is user context i's doorbell page.
  uint8_t* doorbell() { return db_; }
  uint8_t* doorbell_page(uint32_t i) { return db_ ? db_ + uint64_t(i) * VSTELLAR_DB_PAGE_SIZE : nullptr; }
  // Word `off` of doorbell page `page` (word 0 is need_kick), shared with
  // the device.
  std::atomic_ref<uint32_t> DoorbellWord(uint32_t page, uint32_t off) {
    return std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(doorbell_page(page) + off));
  }
  // Publishes `value` at word `off` as the provider does: the WQEs it
  // covers are in memory before it (release), it is visible before
  // need_kick is read (full fence), and the kick queue is kicked only if
  // the device set need_kick (and `kick` allows).
  void RingDoorbell(uint32_t page, uint32_t off, uint32_t value, bool kick = true);
  // Whether the CQE at consumer index `ci` of the ring of 1 << log CQEs at
  // `gpa` is new (its owner bit is this pass's); if so, copied to *out.
  // The caller advances ci and stores it in the CQ's doorbell slot.
  bool TakeCqe(uint64_t gpa, uint32_t log, uint32_t ci, vstellar_cqe* out);

  // A control command: header + body (+ pages) at kReqGpa, response buffer
  // of 16 + resp_len bytes at kRespGpa. Waits for the device.
  CmdResult Command(uint16_t op, uint32_t ucontext, const void* body, size_t len, uint32_t resp_len,
                    int timeout_ms = 5000);
  // Lower level: posts a chain of (gpa, len, writable) on queue q and kicks.
  struct DescSpec {
    uint64_t gpa;
    uint32_t len;
    bool write;
  };
  uint16_t Post(uint32_t q, const std::vector<DescSpec>& chain, bool kick = true);
  void Kick(uint32_t q);
  // Waits for the next used element of q.
  bool WaitUsed(uint32_t q, uint16_t* head, uint32_t* len, int timeout_ms = 5000);
  // Raw ring access for hostile tests.
  void SetAvailIdx(uint32_t q, uint16_t idx);
  // Events the device wrote so far (eventq buffers returned).
  // Page faults (32-byte events) are also copied whole into *faults.
  std::vector<vstellar_event> Events(int timeout_ms = 0, std::vector<vstellar_event_page_fault>* faults = nullptr);

 private:
  struct Queue {
    uint32_t num = 0;
    uint16_t avail = 0, used_seen = 0;
    int kick = -1, call = -1;
  };
  uint64_t RingGpa(uint32_t q) const { return 0x10000ull * (q + 1); }
  bool Handshake(const std::string& socket, std::string* err, bool mem_table);
  std::vector<uint16_t> bases_;  // StopQueues' GET_VRING_BASE answers
  FrontendOptions o_;
  int sock_ = -1, ram_fd_ = -1, db_fd_ = -1;
  uint8_t* mem_ = nullptr;
  uint8_t* db_ = nullptr;
  uint64_t db_gpa_ = 0;
  uint64_t features_ = 0;
  std::vector<const Frontend*> others_;
  struct DeviceMemory {
    uint64_t gpa, size;
    int fd;
    uint8_t* p;
  };
  std::vector<DeviceMemory> device_mem_;
  std::vector<Queue> qs_;
  uint32_t cmd_id_ = 1;
};

}  // namespace vstellard
