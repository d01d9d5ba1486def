// vstellard's data path for one device: doorbell records, SQ/RQ rings (WQE
// fetch, check, hand-over to the engine), CQE rings. Implementation and its
// rules in src/datapath.cc; docs/vstellard.md ("Data path").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/virtio_vstellar.h>

#include "vstellard/objects.h"
#include "vstellard/pvdma.h"
#include "vstellard/device_state.h"

namespace vstellard {

struct DeviceShared;

// What the data path reports to its device. Device implements it; a test
// can record the calls.
class DataPathEvents {
 public:
  virtual ~DataPathEvents() = default;
  // An async event for the guest's event queue.
  virtual void PostEvent(uint16_t type, uint32_t object, uint32_t ucontext, uint32_t info) = 0;
  // A page fault of on-demand MR `mrn` (struct vstellar_event_page_fault);
  // false if it could not be queued (the backlog is full): ask again later.
  virtual bool PostPageFault(uint32_t mrn, uint32_t ucontext, uint64_t iova, uint32_t npages, bool write) = 0;
  // A CQ notification for CQ notification queue `cq_queue`.
  virtual void NotifyCq(uint32_t cq_queue, const vstellar_cq_notify& n) = 0;
  // The device is fatal: its doorbells are not read any more.
  virtual bool DeviceFatal() const = 0;
};

struct DataPathCounters {
  uint64_t wqes = 0;        // SQ and RQ WQEs fetched from guest rings
  uint64_t bad_wqes = 0;    // WQEs that failed validation (QP moved to ERR)
  uint64_t cqes = 0;        // CQEs written into guest CQ rings
  uint64_t cq_overflows = 0;
  uint64_t cq_resizes = 0;  // RESIZE_CQ commands that moved a CQ
  uint64_t db_kicks = 0;      // kick-queue wake-ups
  uint64_t idle_entries = 0;  // times the data path set need_kick and slept
  // WQEs found by the look after going idle (DataPath::Recheck) before a
  // kick came for them: the kick was late (a descheduled vCPU between its
  // index store and its kick) or lost (a guest whose barrier did not hold).
  uint64_t missed_kicks = 0;
  // Receive WQEs taken when a message found none (RefillRecv): posted by
  // the guest before the message came, not yet fetched by a scan.
  uint64_t refilled_recvs = 0;
};

class DataPath {
 public:
  DataPath(unsigned device_id, DeviceShared& shared, const DeviceState& state, const DeviceTransport& transport,
           Pvdma& pvdma, ObjectTables& objects, DataPathEvents& events);

  // The device moved to another worker thread (Device::Rebind).
  void Rebind(DeviceShared& shared) { sh_ = &shared; }
  // The kick queue was kicked: poll the doorbells until idle again.
  void OnKick();
  // Whether the doorbells are polled now (kicked or work found less than
  // poll_ns ago). The daemon calls Poll() on every loop turn while this is
  // true and sleeps in epoll otherwise.
  bool polling() const { return polling_; }
  void Poll();
  // Once, DeviceShared::recheck_ns after going idle: the doorbells again.
  // Work found then came without its kick (missed_kicks): it is taken and
  // the data path polls again, so such a guest loses a moment, not a WQE.
  // True if it found work.
  bool Recheck();
  // The device was reset: stop polling.
  void Stop() { polling_ = false; }
  // The engine has a message for QP `qpn` and no receive WQE for it
  // (Engine::set_recv_refill): takes what the guest published on the QP's
  // RQ, or its SRQ's ring, since the last scan.
  void RefillRecv(uint32_t qpn);
  unsigned device_id() const { return id_; }

  // Doorbell pages: the host pointer of a context's page (mapped on first
  // use), a slot's record back to zero, the cached pointers dropped after
  // a new memory table.
  void StoreDb(uint32_t uctx, uint8_t* p, uint32_t v);
  uint8_t* DbPage(uint32_t uctx);
  void ResetDbSlot(uint32_t uctx, uint32_t slot);
  void ForgetDbPages();

  // Engine completions of CQ `cqh` -> CQEs in its guest ring.
  void DrainCq(uint32_t cqh);
  // Every CQE written and not yet polled (between the guest's consumer
  // index and ours) is in guest memory with its owner bit set: checked at
  // a stop and after a migration, when a write the migration missed would
  // leave the guest waiting on, or re-reading, an old slot. Logs each CQ
  // that fails; returns how many did.
  unsigned CheckCqRings(const char* when);
  // RESIZE_CQ: CQ `cqh` moves to the ring `geom` describes (pages,
  // page_shift, ring_offset, log_cqe) with the CQEs its guest has not
  // polled; *moved says how many. A VSTELLAR_STATUS_*; on failure the CQ
  // is unchanged.
  uint16_t ResizeCq(uint32_t cqh, const CqObj& geom, uint32_t* moved);
  // RESIZE_SRQ: SRQ `h` takes what its old ring holds, then reads `ring`
  // (same stride). A VSTELLAR_STATUS_*.
  uint16_t ResizeSrq(uint32_t h, const RingGeom& ring);
  // After MODIFY_QP moved a QP to `next`: RESET forgets every WQE; WQEs
  // posted before the QP could take them are picked up now.
  void OnQpModified(QpObj& q, uint8_t next);

  const DataPathCounters& counters() const { return n_; }
  // One line per QP and CQ of the device as the data path sees it: the
  // guest's producer indices against what was fetched, a QP blocked on a
  // full engine queue or broken, a CQ's written and polled indices and
  // overflow (vstellar-stat --qps, the state dump of a hang).
  std::vector<std::string> Describe();

 private:
  bool RingRead(const RingGeom& g, uint32_t idx, void* dst);
  void SetNeedKick(uint32_t v);
  bool ScanDoorbells();
  bool ServiceWq(QpObj& q, uint8_t* slot, bool send, uint32_t& budget);
  bool ServiceSrq(uint32_t h, SrqObj& s, uint8_t* slot, uint32_t& budget);
  bool TakeRecv(const RingGeom& ring, uint32_t owner, uint32_t pdn, uint32_t qpn, uint32_t idx,
                vstellar::RecvWr* wr, vstellar::Sge* sges, uint64_t* wr_id);
  void SrqToErr(uint32_t h, SrqObj& s, uint32_t info);
  uint8_t CheckSendWqe(QpObj& q, const uint8_t* buf, uint32_t len, vstellar::SendWr* wr, vstellar::Sge* sges,
                       uint8_t* vendor);
  uint8_t CheckKeyWqe(QpObj& q, const vstellar_send_wqe& w, vstellar::SendWr* wr, uint8_t* vendor);
  uint8_t CheckFastReg(QpObj& q, const vstellar_send_wqe& w, vstellar::FastRegWr* reg, uint8_t* vendor);
  uint8_t CheckRecvWqe(uint32_t owner, uint32_t pdn, const uint8_t* buf, uint32_t len, vstellar::RecvWr* wr,
                       vstellar::Sge* sges);
  uint8_t CheckSge(uint32_t owner, uint32_t pdn, const uint8_t* raw, vstellar::Sge* out);
  uint8_t CheckUdDest(const vstellar_send_wqe& w, vstellar::UdDest* ud);
  void QpToErr(QpObj& q, uint16_t event, uint32_t info);
  void CompleteDirect(QpObj& q, bool send, uint32_t idx, uint64_t wr_id, uint8_t op, uint8_t status,
                      uint8_t vendor_err = 0);
  void WriteCqe(uint32_t cqh, vstellar_cqe& cqe);
  static uint64_t CqeGpa(const CqObj& cq, uint32_t idx);
  // CQEs in [ci, pi) whose owner bit is not the one written (the first in *first).
  uint32_t MissingCqes(const CqObj& cq, uint32_t ci, uint32_t* first);
  static uint64_t NowNs();

  unsigned id_;
  DeviceShared* sh_;  // the worker's; Rebind() when the device moves to another
  const DeviceState& state_;
  const DeviceTransport& transport_;
  Pvdma& pvdma_;
  ObjectTables& obj_;
  DataPathEvents& events_;

 public:
  DataPathEvents& events() { return events_; }

 private:
  bool polling_ = false;
  void StartPolling();  // polling_ = true, and tell the daemon (DeviceShared::woken)
  uint64_t last_work_ns_ = 0;
  // Round robin: the next scan starts at the first QP (by QPN) and SRQ (by
  // handle) at or after these, so a budget that runs out (DeviceShared::
  // wqe_budget_device) does not always leave the same queues waiting.
  uint32_t qp_scan_from_ = 0, srq_scan_from_ = 0;
  DataPathCounters n_;
};

}  // namespace vstellard
