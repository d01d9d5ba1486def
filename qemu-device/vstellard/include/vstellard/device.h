// One virtual vStellar device = one QEMU connection. Device coordinates
// its parts and owns them:
//   DeviceState  what the device offers and the driver took: features,
//                config space, limits (device_state.h)
//   Session      the vhost-user session (vhost_user.h)
//   Pvdma        this guest's memory (pvdma.h)
//   Virtqueue    one per queue: control, event, kick, CQ notification
//                queues (virtqueue.h)
//   Commands     what each control command does (commands.h)
//   DataPath     doorbells, SQ/RQ rings, CQE rings (datapath.h)
//   ObjectTables the device's verbs objects (objects.h)
// and itself carries the control queue's requests to Commands, async
// events and CQ notifications to their queues, and the device's fatal
// state.
//
// Isolation: every handle a guest names is looked up in this device's own
// tables (and must belong to the command's user context); guest memory is
// reached only through this device's Pvdma; a bad request fails that
// request with a status, a corrupt ring makes this device fatal. Nothing a
// guest sends can end the daemon or reach another device.
#pragma once

#include <endian.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>
#include <string>
#include <utility>
#include <vector>

#include <vstellar/engine.h>
#include <vstellar/virtio_vstellar.h>

#include "vstellard/commands.h"
#include "vstellard/datapath.h"
#include "vstellard/device_state.h"
#include "vstellard/shared_by_devices.h"
#include "vstellard/objects.h"
#include "vstellard/state_transfer.h"
#include "vstellard/pvdma.h"
#include "vstellard/vhost_user.h"
#include "vstellard/virtqueue.h"

namespace vstellard {

struct DeviceStats {
  unsigned id = 0;
  PvdmaStats pvdma;
  uint64_t commands = 0, commands_failed = 0;
  uint16_t last_status = 0;
  uint64_t events = 0, events_dropped = 0, events_merged = 0, cq_notifies = 0;
  uint32_t cq_notify_backlog = 0;  // notifications waiting for the guest to take them
  bool fatal = false;
  uint32_t ucontexts = 0, pds = 0, cqs = 0, qps = 0, mrs = 0;
  uint64_t memory = 0, memory_peak = 0, memory_refused = 0;  // host bytes charged (memory_budget.h)
  // Data path
  uint64_t wqes = 0;        // SQ and RQ WQEs fetched from guest rings
  uint64_t bad_wqes = 0;    // WQEs that failed validation (QP moved to ERR)
  uint64_t cqes = 0;        // CQEs written into guest CQ rings
  uint64_t cq_overflows = 0;
  uint64_t db_kicks = 0;    // kick-queue wake-ups
  uint64_t idle_entries = 0;  // times the data path set need_kick and slept
  uint64_t missed_kicks = 0;  // WQEs found before their kick came, late or lost (DataPath::Recheck)
  bool polling = false;
  bool closed = false;        // the frontend went away: these are its last counters
};

class Device : private DataPathEvents, private DeviceStateTransfer {
 public:
  // `addresses`: what the device may hold as GIDs (DeviceState::addresses).
  Device(unsigned id, DeviceShared& shared, const std::vector<vstellar::IpAddr>& addresses);
  ~Device();

  unsigned id() const { return id_; }
  Session& session() { return session_; }
  Pvdma& pvdma() { return pvdma_; }

  // One vhost-user message. Returns the outcome (reply to send; error =
  // close the connection).
  Outcome OnMessage(Message&& m);
  // The frontend's kick (or a poll) of queue q.
  void OnKick(uint32_t q);
  // One turn of the daemon's loop begins: the device's control budget
  // (DeviceShared::control_budget) is full again, and every write of the
  // last turn is done (the dirty log sets their bits once more).
  void BeginTurn() {
    control_left_ = sh_->control_budget;
    pvdma_.dirty_log()->Flush();
  }
  // Whether the control queue had more requests than the turn's budget;
  // the daemon then calls ContinueControl() next turn instead of sleeping.
  bool ControlPending() const { return control_pending_; }
  void ContinueControl() {
    if (control_pending_) ProcessControl();
  }
  // Engine async event for one of this device's QPs or CQs.
  void OnEngineEvent(const vstellar::AsyncEvent& e);
  bool OwnsQp(uint32_t qpn) const { return obj_.qps.count(qpn) != 0; }
  // The engine has a message for QP `qpn` and no receive WQE posted for it.
  void RefillRecv(uint32_t qpn) { dp_.RefillRecv(qpn); }
  // Whether an engine event names one of this device's objects.
  bool OwnsEvent(const vstellar::AsyncEvent& e) const;
  bool HasQps() const { return !obj_.qps.empty(); }
  // Data path: whether this device polls its doorbell pages now; the
  // daemon calls PollDataPath() on every loop turn while this is true.
  bool Polling() const { return dp_.polling() && !frozen_; }
  // Stopped by the frontend (a VM paused or migrating; device_migration.cc):
  // its engine objects are out of the engine until its rings start again.
  bool frozen() const { return frozen_; }
  void PollDataPath() {
    if (!frozen_) dp_.Poll();
  }
  // The look after going idle: the missed kicks so far if it found work
  // (the daemon logs them), else 0.
  uint64_t RecheckDataPath() { return !frozen_ && dp_.Recheck() ? dp_.counters().missed_kicks : 0; }
  // Queues an async event (delivered when the event queue has a buffer).
  void PostEvent(uint16_t type, uint32_t object, uint32_t ucontext, uint32_t info) override;
  bool PostPageFault(uint32_t mrn, uint32_t ucontext, uint64_t iova, uint32_t npages, bool write) override;
  bool QueueEvent(const vstellar_event_page_fault& e, uint32_t len);

  // ---- moving to another worker thread (Worker::Place) ----
  // The device's objects in its worker's engine (Engine::detach).
  vstellar::EngineObjects EngineObjects() const;
  // The peers of its RC and UC QPs that have one (RTR and later): where
  // each sends and the peer's QPN.
  std::vector<std::pair<vstellar::Endpoint, uint32_t>> ConnectedPeers() const;
  std::vector<uint32_t> Qpns() const;
  // Why the device cannot move (empty: it can). Its MRs translate through
  // its worker's ATC (--translation atc), or its QPs are in multicast
  // groups (the worker's link joined them).
  std::string Unmovable() const;
  // What names this device in the GidTable (its object tables).
  const void* GidHolder() const { return &obj_; }
  // From now on the device is served by the worker that shares `shared`.
  void Rebind(DeviceShared& shared) {
    sh_ = &shared;
    cmds_.Rebind(shared);
    dp_.Rebind(shared);
  }

  DeviceStats stats() const;
  std::vector<std::string> Describe() { return dp_.Describe(); }

  // Kick fds to watch: (fd, queue index) of every started queue.
  std::vector<std::pair<int, uint32_t>> KickFds() const;

 private:
  // DataPathEvents
  void NotifyCq(uint32_t cq_queue, const vstellar_cq_notify& n) override;
  bool DeviceFatal() const override { return fatal_; }

  Outcome HandleMessage(Message&& m);
  // Live migration (device_migration.cc).
  void Freeze(bool tell_peers = true);
  void Thaw();
  bool SaveState(std::vector<uint8_t>* out, std::string* err);
  bool LoadState(const std::vector<uint8_t>& bytes, std::string* err);
  // The engine's multicast memberships of the device's QPs (obj_.mcast):
  // left while the device is stopped (a membership is its engine's link's
  // and cannot move with the QPs), joined again where it runs next.
  using McastGroups = std::map<vstellar::Gid, std::set<uint32_t>>;
  void LeaveGroups();
  bool JoinGroups(std::string* err);
  int JoinGroups(const McastGroups& groups, const std::function<vstellar::Qp*(uint32_t)>& qp_of,
                 std::vector<std::pair<vstellar::Qp*, vstellar::Gid>>* joined, std::string* err);
  bool BeginStateTransfer(bool save, Fd fd) override;
  bool CheckStateTransfer() override;
  void ProcessControl();
  uint16_t ExecuteCommand(const std::vector<uint8_t>& req, std::vector<uint8_t>* resp);
  void FlushEvents();
  void FlushCqNotifies();
  bool PushToQueue(uint32_t q, const void* data, uint32_t len);
  void Fatal(const std::string& why);
  void ResetState();

  unsigned id_;
  DeviceShared* sh_;  // the worker's; Rebind() when the device moves to another
  Pvdma pvdma_;
  DeviceState state_;
  Session session_;  // reads and writes state_
  std::vector<Virtqueue> qs_;
  // Queues to interrupt once when they get their call fd after a stop
  // (Freeze): an interrupt signalled just before the stop went to a VM
  // that stopped, or to the source QEMU of a migration, and the driver may
  // wait for it; a spurious one costs the driver a look at its used ring.
  std::vector<bool> call_after_stop_;
  void CallAfterStop(uint32_t index);  // once the queue has its kick and call fds
  ObjectTables obj_;
  DataPath dp_;
  Commands cmds_;
  bool fatal_ = false;
  std::string fatal_why_;
  // Live migration: stopped, with the engine objects held out of the
  // engine (why not, if they could not be); the state on its way.
  bool frozen_ = false;
  vstellar::Detached frozen_objs_;
  std::string freeze_error_;
  StateTransfer transfer_;
  bool transfer_save_ = false, transfer_ok_ = false;
  // When the device stopped, and when a state began to arrive: the log
  // says how much of a migration's downtime the device took (make bench).
  std::chrono::steady_clock::time_point stopped_at_, load_began_at_;
  uint32_t control_left_ = 0;     // commands this turn may still execute
  bool control_pending_ = false;  // the control queue may hold more

  // Events the driver has not taken yet. A burst of them (a peer that
  // fails a hundred of this guest's connections at once) must
  // neither be lost wholesale nor cost the device: one identical to an
  // event still waiting is merged into it, the backlog holds a few per live
  // object (so every QP's error fits), and what still does not fit is
  // dropped and counted. Only the device's own fault makes it FATAL.
  // Events waiting for a buffer: 16 bytes (struct vstellar_event) or, for
  // page faults, 32 (struct vstellar_event_page_fault, whose first 16
  // bytes are laid out as vstellar_event's).
  struct QueuedEvent {
    vstellar_event_page_fault e;
    uint32_t len;
  };
  std::deque<QueuedEvent> events_;
  // (type, object, ucontext, iova): a page fault is the same event as
  // another only for the same pages.
  std::set<std::tuple<uint16_t, uint32_t, uint32_t, uint64_t>> events_waiting_;
  uint64_t events_merged_ = 0;
  // Notifications the guest has not taken from its CQ notification queues
  // yet, at most one per CQ (a CQ already waiting is not queued again: the
  // driver polls the whole CQ on one), so a guest that never takes them
  // cannot grow this beyond its number of CQs.
  std::deque<vstellar_cq_notify> cq_notifies_[VSTELLAR_MAX_CQ_QUEUES];
  std::unordered_set<uint32_t> cq_notify_waiting_;
  uint64_t commands_ = 0, commands_failed_ = 0, events_n_ = 0, events_dropped_ = 0, cq_notify_n_ = 0;
  uint16_t last_status_ = 0;
};

}  // namespace vstellard
