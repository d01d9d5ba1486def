// The control commands of one device: what each VSTELLAR_CMD_* does to the
// device's object tables and the engine. The command list, the length
// checks and the dispatch come from VSTELLAR_CMD_LIST in virtio_vstellar.h;
// one handler per command (Run<VSTELLAR_CMD_x>), in the file of the object
// it acts on: src/commands.cc (dispatch, device, user contexts, PDs),
// src/commands_cq.cc, _qp.cc, _srq.cc, _mr.cc, _mw.cc, _gid.cc, _mcast.cc.
//
// Commands sees a private copy of the request (Device copied it out of
// guest memory), checks every field before it acts, and answers with a
// status; nothing a request holds can reach another device's objects.
#pragma once

#include <cstdint>
#include <vector>

#include <vstellar/virtio_vstellar.h>

#include "vstellard/datapath.h"
#include "vstellard/device_state.h"
#include "vstellard/objects.h"
#include "vstellard/pvdma.h"
#include "vstellard/shared_by_devices.h"

namespace vstellard {

class Commands {
 public:
  Commands(DeviceShared& shared, const DeviceState& state, const DeviceTransport& transport, Pvdma& pvdma,
           ObjectTables& objects, DataPath& datapath);

  // Executes one request: `req` is the command header and its body (and
  // page list). Returns a VSTELLAR_STATUS_*; on OK *resp is the response
  // body.
  uint16_t Execute(const std::vector<uint8_t>& req, std::vector<uint8_t>* resp);
  // The device moved to another worker thread (Device::Rebind).
  void Rebind(DeviceShared& shared) { sh_ = &shared; }

  // Destroys every object of every context (device reset).
  void DestroyAll();
  // The GSI QP answers QP 1 for exactly the GIDs the device holds.
  void SyncGsiGids();
  // An on-demand MR's faults reach the guest naming MR `h` of context
  // `uctx`, and time out after --odp-fault-timeout.
  void WireOdp(uint32_t h, uint32_t uctx, const std::shared_ptr<OdpTranslator>& odp);
  // What an object holds of host memory, charged when a command makes it
  // and when Device::LoadState restores it: our part (its page list, wr_id
  // and opcode arrays) plus the engine's (`engine_bytes`, its footprint).
  uint64_t SrqBytes(uint32_t pages, const vstellar::SrqInitAttr& init) const;
  static uint64_t CqBytes(uint64_t pages, uint64_t engine_bytes);
  static uint64_t QpBytes(uint64_t pages, uint32_t sq_log_wqe, uint32_t rq_log_wqe, uint64_t engine_bytes);
  // An MR with a list of `pages` page addresses (each with its final host
  // pointer), or `table` bytes of on-demand translation table.
  static uint64_t MrBytes(uint64_t table);
  static uint64_t MrPagesBytes(uint64_t pages) { return MrBytes(16 * pages); }
  static uint64_t MwBytes();

 private:
  // Handlers get the owning context, the body (page list included) and its
  // length, checked against the command's VSTELLAR_CMD_LIST entry.
  uint16_t Dispatch(uint16_t op, uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp);
  // The handler of command Op: one explicit specialization (declared below,
  // defined in its object's commands_*.cc) for every command that is not
  // reserved.
  template <uint16_t Op>
  uint16_t Run(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp);

  uint16_t CheckUctx(uint32_t uctx) const;
  uint16_t Charge(uint64_t bytes, MemoryCharge* charge);
  uint16_t ReadPages(const uint8_t* p, uint32_t n, uint32_t shift, std::vector<uint64_t>* out) const;
  uint16_t AddDbContext(uint32_t key, uint32_t* page);
  bool DatagramsOn() const;
  bool SrqsOn() const;
  bool MemMgtOn() const;
  bool WindowsOn() const;
  uint16_t GidCommand(uint32_t uctx, const uint8_t* b, bool add);
  void ReleaseGid(const vstellar::Gid& g);
  uint16_t QpSource(const vstellar_av& av, const vstellar::IpAddr& peer, vstellar::IpAddr* out);
  uint16_t McastCommand(uint32_t uctx, const uint8_t* b, bool attach);
  uint16_t AllocSlot(uint32_t uctx, uint32_t* slot);
  void FreeSlot(uint32_t uctx, uint32_t slot);
  // CREATE_QP's steps (commands_qp.cc).
  struct QpObjects {
    PdObj* pd = nullptr;
    CqObj *send_cq = nullptr, *recv_cq = nullptr;
    SrqObj* srq = nullptr;  // null: the QP has its own RQ
    uint32_t pdn = 0, send_cqn = 0, recv_cqn = 0, srqh = 0;
  };
  uint16_t FindQpObjects(uint32_t uctx, const vstellar_cmd_create_qp& cmd, QpObjects* out);
  uint16_t CheckQpType(uint32_t uctx, uint8_t type) const;
  void ReleaseQp(uint32_t qpn, QpObj& q);
  uint16_t AddMr(uint32_t uctx, uint32_t pdn, vstellar::Mr* mr, MemoryCharge charge, std::vector<uint8_t>* resp,
                 std::shared_ptr<OdpTranslator> odp = nullptr);
  uint16_t RegOdpMr(uint32_t uctx, const vstellar_cmd_reg_mr& cmd, uint32_t len, PdObj* pd,
                    std::vector<uint8_t>* resp);
  bool OdpOn() const;
  void DestroyAllOf(uint32_t uctx);
  const virtio_vstellar_config& config() const { return state_.config(); }

  DeviceShared* sh_;  // the worker's; Rebind() when the device moves to another
  const DeviceState& state_;
  const DeviceTransport& transport_;
  Pvdma& pvdma_;
  ObjectTables& obj_;
  DataPath& dp_;
};

// Every handler is declared here, so the dispatch in commands.cc calls the
// one its object's file defines. A reserved command's is declared and never
// defined (the dispatch does not call it).
#define VSTELLARD_DECLARE_RUN_(name, opcode, req_len, resp_len, flags) \
  template <>                                                          \
  uint16_t Commands::Run<VSTELLAR_CMD_##name>(uint32_t uctx, const uint8_t* b, uint32_t len, std::vector<uint8_t>* resp);
VSTELLAR_CMD_LIST(VSTELLARD_DECLARE_RUN_)
#undef VSTELLARD_DECLARE_RUN_

}  // namespace vstellard
