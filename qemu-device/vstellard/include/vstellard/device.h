// One virtual vStellar device = one QEMU connection: the vhost-user
// session, PVDMA over that guest's memory, the control virtqueue, the event
// queue, the CQ notification queues, and the device's verbs objects
// (user contexts, PDs, CQs, QPs, MRs) built on the shared engine.
//
// Isolation: every handle a guest names is looked up in this device's own
// tables (and must belong to the command's user context); guest memory is
// reached only through this device's Pvdma; a bad request fails that
// request with a status, a corrupt ring makes this device fatal. Nothing a
// guest sends can end the daemon or reach another device.
#pragma once

#include <endian.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/virtio_vstellar.h>

#include "vstellard/pvdma.h"
#include "vstellard/translate.h"
#include "vstellard/vhost_user.h"

namespace vstellard {

// What all devices of one daemon share (one emulated physical RNIC).
struct DeviceShared {
  vstellar::Engine* engine = nullptr;
  Atc* atc = nullptr;
  PinMode pin = PinMode::kLazy;
  TranslationMode translation = TranslationMode::kEmtt;
  uint16_t peer_port = 47000;  // UDP base port of peer vstellards
  uint32_t host_ip = 0;        // this daemon's IPv4 (host order): part of node GUIDs
  // Test hook: called after a command was copied out of guest memory and
  // before it is validated (tests change guest memory here: double fetch).
  std::function<void(unsigned device)> after_copy;
  // Test hook: called after a WQE was copied out of a guest SQ/RQ ring and
  // before it is validated (tests rewrite the WQE here: double fetch).
  std::function<void(unsigned device, uint32_t qpn, bool send, uint32_t index)> after_wqe_copy;
  // Data path: how long a device keeps polling its doorbells after the last
  // work before it sets need_kick and sleeps.
  uint64_t poll_ns = 50'000;
};

struct DeviceStats {
  unsigned id = 0;
  PvdmaStats pvdma;
  uint64_t commands = 0, commands_failed = 0;
  uint16_t last_status = 0;
  uint64_t events = 0, events_dropped = 0, cq_notifies = 0;
  bool fatal = false;
  uint32_t ucontexts = 0, pds = 0, cqs = 0, qps = 0, mrs = 0;
  // Data path
  uint64_t wqes = 0;        // SQ and RQ WQEs fetched from guest rings
  uint64_t bad_wqes = 0;    // WQEs that failed validation (QP moved to ERR)
  uint64_t cqes = 0;        // CQEs written into guest CQ rings
  uint64_t cq_overflows = 0;
  uint64_t db_kicks = 0;    // kick-queue wake-ups
  uint64_t idle_entries = 0;  // times the data path set need_kick and slept
  bool polling = false;
  bool closed = false;        // the frontend went away: these are its last counters
};

class Device {
 public:
  Device(unsigned id, DeviceShared& shared);
  ~Device();

  unsigned id() const { return id_; }
  Session& session() { return session_; }
  Pvdma& pvdma() { return pvdma_; }

  // One vhost-user message. Returns the outcome (reply to send; error =
  // close the connection).
  Outcome OnMessage(Message&& m);
  // The frontend's kick (or a poll) of queue q.
  void OnKick(uint32_t q);
  // Engine async event for one of this device's QPs or CQs.
  void OnEngineEvent(const vstellar::AsyncEvent& e);
  bool OwnsQp(uint32_t qpn) const { return qps_.count(qpn) != 0; }
  bool OwnsEngineCq(const vstellar::Cq* cq) const;
  bool HasQps() const { return !qps_.empty(); }
  // Data path: whether this device polls its doorbell pages now (it was
  // kicked or found work less than poll_ns ago). The daemon calls
  // PollDataPath() on every loop turn while this is true and sleeps in
  // epoll otherwise.
  bool Polling() const { return polling_; }
  void PollDataPath();
  // Queues an async event (delivered when the event queue has a buffer).
  void PostEvent(uint16_t type, uint32_t object, uint32_t ucontext, uint32_t info);

  DeviceStats stats() const;

  // Kick fds to watch: (fd, queue index) of every started queue.
  std::vector<std::pair<int, uint32_t>> KickFds() const;

 private:
  struct Seg {
    uint64_t gpa;
    uint32_t len;
  };
  struct Chain {
    uint16_t head = 0;
    std::vector<Seg> rd, wr;
    uint64_t rd_len = 0, wr_len = 0;
  };
  struct QueueState {
    bool inited = false;
    uint16_t used_idx = 0;
    bool broken = false;
  };
  struct Ring {
    uint32_t num;
    uint64_t desc, avail, used;  // guest-physical
  };
  enum class Pop { kNone, kChain, kBadChain, kBroken };

  bool RingOf(uint32_t q, Ring* r);
  Pop PopChain(uint32_t q, const Ring& r, Chain* c);
  void PushUsed(uint32_t q, const Ring& r, uint16_t head, uint32_t len);
  void Notify(uint32_t q, const Ring& r, uint16_t old_used);
  void ProcessControl();
  void FlushEvents();
  void FlushCqNotifies();
  bool PushToQueue(uint32_t q, const void* data, uint32_t len);
  void Fatal(const std::string& why);
  void ResetState();

  // Commands. `req` is the private copy; returns status, fills resp body.
  uint16_t Execute(const std::vector<uint8_t>& req, std::vector<uint8_t>* resp);
  uint16_t CheckUctx(uint32_t uctx) const;
  uint16_t ReadPages(const uint8_t* p, uint32_t n, uint32_t shift, std::vector<uint64_t>* out) const;
  uint16_t CmdQueryDevice(std::vector<uint8_t>* resp);
  uint16_t CmdQueryPort(const uint8_t* b, std::vector<uint8_t>* resp);
  uint16_t CmdAllocUctx(uint32_t uctx, std::vector<uint8_t>* resp);
  uint16_t CmdDeallocUctx(uint32_t uctx, const uint8_t* b);
  uint16_t CmdAllocPd(uint32_t uctx, std::vector<uint8_t>* resp);
  uint16_t CmdDeallocPd(uint32_t uctx, const uint8_t* b);
  uint16_t CmdCreateCq(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp);
  uint16_t CmdDestroyCq(uint32_t uctx, const uint8_t* b);
  uint16_t CmdReqNotify(uint32_t uctx, const uint8_t* b);
  uint16_t CmdCreateQp(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp);
  uint16_t CmdModifyQp(uint32_t uctx, const uint8_t* b);
  uint16_t CmdQueryQp(uint32_t uctx, const uint8_t* b, std::vector<uint8_t>* resp);
  uint16_t CmdDestroyQp(uint32_t uctx, const uint8_t* b);
  uint16_t CmdRegMr(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp);
  uint16_t CmdDeregMr(uint32_t uctx, const uint8_t* b);
  uint16_t CmdGid(uint32_t uctx, bool add, const uint8_t* b);
  uint16_t CmdKernelDb(uint32_t uctx, std::vector<uint8_t>* resp);
  uint16_t AddDbContext(uint32_t key, uint32_t* page);
  bool DatagramsOn() const;
  void SyncGsiGids();

  uint32_t cfg32(const __le32& v) const { return le32toh(v); }
  uint16_t AllocSlot(uint32_t uctx, uint32_t* slot);
  void FreeSlot(uint32_t uctx, uint32_t slot);
  void DestroyQp(uint32_t qpn);

  // Data path (datapath.cc).
  struct RingGeom {
    std::vector<uint64_t> pages;
    uint32_t shift = 12;
    uint64_t offset = 0;
    uint32_t log_n = 0, log_stride = 0;
  };
  struct QpObj;
  bool RingRead(const RingGeom& g, uint32_t idx, void* dst);
  uint8_t* DbPage(uint32_t uctx);
  void ResetDbSlot(uint32_t uctx, uint32_t slot);
  void SetNeedKick(uint32_t v);
  bool ScanDoorbells();
  bool ServiceWq(QpObj& q, uint8_t* slot, bool send);
  uint8_t CheckSendWqe(QpObj& q, const uint8_t* buf, uint32_t len, vstellar::SendWr* wr, vstellar::Sge* sges);
  uint8_t CheckRecvWqe(QpObj& q, const uint8_t* buf, uint32_t len, vstellar::RecvWr* wr, vstellar::Sge* sges);
  uint8_t CheckSge(QpObj& q, const uint8_t* raw, uint32_t need, vstellar::Sge* out);
  uint8_t CheckUdDest(const vstellar_send_wqe& w, vstellar::UdDest* ud);
  void QpToErr(QpObj& q, uint16_t event, uint32_t info);
  void CompleteDirect(QpObj& q, bool send, uint32_t idx, uint64_t wr_id, uint8_t op, uint8_t status);
  void DrainCq(uint32_t cqh);
  void WriteCqe(uint32_t cqh, vstellar_cqe& cqe);
  void OnQpModified(QpObj& q, uint8_t next);
  uint64_t NowNs() const;
  void DestroyAllOf(uint32_t uctx);

  struct UContext {
    uint32_t db_page = 0;
    uint8_t* page = nullptr;  // host pointer to its doorbell page (cached)
    std::vector<bool> slots;  // VSTELLAR_DB_SLOTS_PER_PAGE
  };
  struct PdObj {
    uint32_t owner;
    vstellar::Pd* pd;
    // Kernel PDs: the MR behind VSTELLAR_LOCAL_DMA_LKEY (guest-physical,
    // local access only). Not in mrs_: no guest can deregister it.
    vstellar::Mr* dma_mr = nullptr;
  };
  struct CqObj {
    uint32_t owner;
    vstellar::Cq* cq;
    uint32_t cq_queue, slot, log_cqe;
    uint32_t page_shift;
    uint64_t ring_offset;
    std::vector<uint64_t> pages;
    bool armed = false;
    // Data path: CQEs written (free-running), arm value last consumed,
    // overflow latched (CQ_ERR sent, no more CQEs).
    uint32_t pi = 0, last_arm = 0;
    bool overflow = false;
  };
  struct QpObj {
    uint32_t owner;
    vstellar::Qp* qp;
    uint8_t type = VSTELLAR_QPT_RC;  // VSTELLAR_QPT_*
    uint32_t pdn, send_cqn, recv_cqn, slot;
    std::vector<uint64_t> sq_pages, rq_pages;
    // Data path: ring geometry, WQEs fetched (free-running), the guest
    // wr_id of each slot (the engine's wr_id is the WQE index), the send
    // opcode of each SQ slot, limits granted at create.
    RingGeom sq, rq;
    uint32_t sq_ci = 0, rq_ci = 0;
    std::vector<uint64_t> sq_wrid, rq_wrid;
    std::vector<uint8_t> sq_op;
    uint32_t max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
    bool broken = false;   // doorbell record corrupt: not read until RESET
    bool blocked = false;  // the engine's queue was full: rescan after a completion
  };
  struct MrObj {
    uint32_t owner;
    vstellar::Mr* mr;
    uint32_t pdn;
  };

  unsigned id_;
  DeviceShared& sh_;
  Pvdma pvdma_;
  Session session_;
  std::vector<QueueState> qs_;
  bool fatal_ = false;
  std::string fatal_why_;

  uint32_t next_handle_ = 1;
  std::map<uint32_t, UContext> uctx_;
  std::vector<bool> db_pages_used_;
  std::map<uint32_t, PdObj> pds_;
  std::map<uint32_t, CqObj> cqs_;
  std::map<uint32_t, QpObj> qps_;  // by QPN
  std::map<uint32_t, MrObj> mrs_;
  std::map<uint32_t, std::array<uint8_t, 16>> gids_;

  std::deque<vstellar_event> events_;
  std::deque<vstellar_cq_notify> cq_notifies_[VSTELLAR_MAX_CQ_QUEUES];
  uint64_t commands_ = 0, commands_failed_ = 0, events_n_ = 0, events_dropped_ = 0, cq_notify_n_ = 0;
  uint16_t last_status_ = 0;
  bool polling_ = false;
  uint64_t last_work_ns_ = 0;
  uint64_t wqes_ = 0, bad_wqes_ = 0, cqes_ = 0, cq_overflows_ = 0, db_kicks_ = 0, idle_entries_ = 0;
};

}  // namespace vstellard
