// vstellard's data path: doorbell records, SQ/RQ rings, CQE rings.
// See docs/vstellard.md ("Data path") and docs/virtio-vstellar.md.
//
// Rules: a WQE is copied out of guest memory
// before anything in it is looked at; every index, count, key, length and
// address is checked against the QP's limits, the ring and the MR; a bad WQE
// completes with an error and moves its QP to ERR, nothing else. Doorbell
// records are read with single atomic loads; the device polls them only
// while it is active and sets need_kick before it sleeps.
#include <endian.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "vstellard/datapath.h"
#include "vstellard/shared_by_devices.h"
#include "vstellard/translate.h"

namespace vstellard {

namespace {

using vstellar::WcStatus;
using vstellar::WrOpcode;

constexpr uint32_t kMaxStride = 1u << VSTELLAR_MAX_LOG_STRIDE;  // CREATE_QP refuses larger slots
static_assert(offsetof(vstellar_send_wqe, wr_id) == 0 && offsetof(vstellar_recv_wqe, wr_id) == 0,
              "ServiceWq reads wr_id at offset 0 of both WQE kinds");

uint32_t LoadLe32(const uint8_t* p) {
  return le32toh(__atomic_load_n(reinterpret_cast<const uint32_t*>(p), __ATOMIC_ACQUIRE));
}
void StoreLe32(uint8_t* p, uint32_t v) {
  __atomic_store_n(reinterpret_cast<uint32_t*>(p), htole32(v), __ATOMIC_RELEASE);
}

uint8_t WcOpOfSend(uint8_t op) {
  switch (op) {
    case VSTELLAR_WR_LOCAL_INV: return VSTELLAR_WC_LOCAL_INV;
    case VSTELLAR_WR_REG_MR: return VSTELLAR_WC_REG_MR;
    case VSTELLAR_WR_BIND_MW: return VSTELLAR_WC_BIND_MW;
    case VSTELLAR_WR_RDMA_WRITE:
    case VSTELLAR_WR_RDMA_WRITE_IMM: return VSTELLAR_WC_RDMA_WRITE;
    case VSTELLAR_WR_RDMA_READ: return VSTELLAR_WC_RDMA_READ;
    case VSTELLAR_WR_ATOMIC_CMP_SWP: return VSTELLAR_WC_COMP_SWAP;
    case VSTELLAR_WR_ATOMIC_FETCH_ADD: return VSTELLAR_WC_FETCH_ADD;
    default: return VSTELLAR_WC_SEND;
  }
}

// The CQE's status byte for an engine completion status (one numbering).
constexpr uint8_t CqeStatus(WcStatus s) { return uint8_t(s); }

// The engine's numbering of the key WQEs (libibverbs') and of their
// failure reasons (the device's status codes).
WrOpcode EngineOp(uint8_t op) {
  switch (op) {
    case VSTELLAR_WR_LOCAL_INV: return WrOpcode::LOCAL_INV;
    case VSTELLAR_WR_SEND_WITH_INV: return WrOpcode::SEND_WITH_INV;
    case VSTELLAR_WR_REG_MR: return WrOpcode::REG_MR;
    case VSTELLAR_WR_BIND_MW: return WrOpcode::BIND_MW;
    default: return WrOpcode(op);
  }
}
static_assert(uint32_t(vstellar::VENDOR_BAD_FIELD) == uint32_t(VSTELLAR_STATUS_BAD_FIELD) &&
              uint32_t(vstellar::VENDOR_BAD_HANDLE) == uint32_t(VSTELLAR_STATUS_BAD_HANDLE) &&
              uint32_t(vstellar::VENDOR_BAD_STATE) == uint32_t(VSTELLAR_STATUS_BAD_STATE) &&
              uint32_t(vstellar::VENDOR_BAD_ADDRESS) == uint32_t(VSTELLAR_STATUS_BAD_ADDRESS) &&
              uint32_t(vstellar::VENDOR_ACCESS) == uint32_t(VSTELLAR_STATUS_ACCESS) && uint32_t(vstellar::VENDOR_BUSY) == uint32_t(VSTELLAR_STATUS_BUSY),
              "engine vendor_err values are the device's status codes");
static_assert(vstellar::ACCESS_MW_BIND == VSTELLAR_ACCESS_MW_BIND && vstellar::ACCESS_ALL_SUPPORTED == VSTELLAR_ACCESS_VALID,
              "access flags are passed through");

bool AllZero(const uint8_t* p, size_t n) {
  return std::all_of(p, p + n, [](uint8_t c) { return c == 0; });
}

}  // namespace

DataPath::DataPath(unsigned device_id, DeviceShared& shared, const DeviceState& state, const DeviceTransport& transport,
                   Pvdma& pvdma, ObjectTables& objects, DataPathEvents& events)
    : id_(device_id),
      sh_(&shared),
      state_(state),
      transport_(transport),
      pvdma_(pvdma),
      obj_(objects),
      events_(events) {}

uint64_t DataPath::NowNs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

// Copies WQE slot `idx` (one stride) out of a ring that may cross pages.
bool DataPath::RingRead(const RingGeom& g, uint32_t idx, void* dst) {
  const uint64_t ps = uint64_t{1} << g.shift;
  const uint64_t stride = uint64_t{1} << g.log_stride;
  uint64_t off = g.offset + (uint64_t(idx & ((1u << g.log_n) - 1)) << g.log_stride);
  auto* d = static_cast<uint8_t*>(dst);
  uint64_t left = stride;
  while (left) {
    const uint64_t pi = off >> g.shift, in = off & (ps - 1);
    if (pi >= g.pages.size()) return false;
    const uint64_t n = std::min(left, ps - in);
    if (!pvdma_.Read(g.pages[pi] + in, d, n)) return false;
    d += n;
    off += n;
    left -= n;
  }
  return true;
}

uint8_t* DataPath::DbPage(uint32_t uctx) {
  auto it = obj_.uctx.find(uctx);
  if (it == obj_.uctx.end()) return nullptr;
  UContext& u = it->second;
  if (u.page) return u.page;
  // Only this device's region: the table also holds the doorbells of the
  // guest's other vStellar devices.
  const MemRegion* r = transport_.DoorbellRegion();
  if (!r) return nullptr;
  const uint64_t off = uint64_t(u.db_page) * VSTELLAR_DB_PAGE_SIZE;
  if (off + VSTELLAR_DB_PAGE_SIZE > r->size) return nullptr;
  uint64_t contig = 0;
  uint8_t* p = pvdma_.Map(r->gpa + off, &contig);
  if (!p || contig < VSTELLAR_DB_PAGE_SIZE) return nullptr;
  u.page = p;
  u.page_gpa = r->gpa + off;
  return p;
}

// A store of the device's into a doorbell page (which QEMU migrates as
// guest memory): marked in the dirty log like every other write.
void DataPath::StoreDb(uint32_t uctx, uint8_t* p, uint32_t v) {
  StoreLe32(p, v);
  const UContext& u = obj_.uctx.at(uctx);
  pvdma_.dirty_log()->Mark(u.page_gpa + uint64_t(p - u.page), 4);
}

void DataPath::ResetDbSlot(uint32_t uctx, uint32_t slot) {
  if (slot < VSTELLAR_DB_FIRST_SLOT || slot >= VSTELLAR_DB_SLOTS_PER_PAGE) return;
  if (uint8_t* p = DbPage(uctx)) {
    StoreDb(uctx, p + VSTELLAR_DB_SLOT_SIZE * slot, 0);
    StoreDb(uctx, p + VSTELLAR_DB_SLOT_SIZE * slot + 4, 0);
  }
}

void DataPath::ForgetDbPages() {
  for (auto& [h, u] : obj_.uctx) u.page = nullptr;
}

void DataPath::SetNeedKick(uint32_t v) {
  for (auto& [h, u] : obj_.uctx)
    if (uint8_t* p = DbPage(h)) StoreDb(h, p + offsetof(vstellar_db_page_hdr, need_kick), v);
}

// One pass over the user QPs' and SRQs' doorbell records, within this
// turn's budgets: at most wqe_budget_queue WQEs of each queue and
// wqe_budget_device of the whole device, starting where the last pass
// stopped. True if anything was done (then the daemon polls again next
// turn, so what is left is not lost).
bool DataPath::ScanDoorbells() {
  if (events_.DeviceFatal()) return false;
  bool work = false;
  uint32_t budget = sh_->wqe_budget_device;
  auto qit = obj_.qps.lower_bound(qp_scan_from_);
  for (size_t k = 0; k < obj_.qps.size() && budget; k++) {
    if (qit == obj_.qps.end()) qit = obj_.qps.begin();
    QpObj& q = qit->second;
    qp_scan_from_ = qit->first + 1;
    ++qit;
    // Kernel QPs made before the kernel had a doorbell page have no slot.
    if (q.slot < VSTELLAR_DB_FIRST_SLOT || q.broken) continue;
    uint8_t* page = DbPage(q.owner);
    if (!page) continue;
    uint8_t* slot = page + VSTELLAR_DB_SLOT_SIZE * q.slot;
    if (!q.srqh) work |= ServiceWq(q, slot, /*send=*/false, budget);  // on an SRQ, rq_pi means nothing
    work |= ServiceWq(q, slot, /*send=*/true, budget);
  }
  budget = sh_->wqe_budget_device;  // SRQs have their own: QPs cannot starve them
  auto sit = obj_.srqs.lower_bound(srq_scan_from_);
  for (size_t k = 0; k < obj_.srqs.size() && budget; k++) {
    if (sit == obj_.srqs.end()) sit = obj_.srqs.begin();
    const uint32_t h = sit->first;
    SrqObj& s = sit->second;
    srq_scan_from_ = h + 1;
    ++sit;
    if (s.broken) continue;
    uint8_t* page = DbPage(s.owner);
    if (page) work |= ServiceSrq(h, s, page + VSTELLAR_DB_SLOT_SIZE * s.slot, budget);
  }
  return work;
}

void DataPath::StartPolling() {
  if (!polling_) sh_->woken.push_back(id_);
  polling_ = true;
}

void DataPath::OnKick() {
  n_.db_kicks++;
  SetNeedKick(0);
  StartPolling();
  last_work_ns_ = NowNs();
  Poll();
}

void DataPath::Poll() {
  if (!polling_) return;
  const uint64_t now = NowNs();
  if (ScanDoorbells()) {
    last_work_ns_ = now;
    return;
  }
  if (now - last_work_ns_ < sh_->poll_ns) return;
  // Going idle: ask for kicks, then look once more (a provider may have
  // stored its index just before it read need_kick == 0).
  SetNeedKick(1);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (ScanDoorbells()) {
    SetNeedKick(0);
    last_work_ns_ = now;
    return;
  }
  polling_ = false;
  n_.idle_entries++;
  sh_->rechecks.push_back({now + sh_->recheck_ns, id_});
}

bool DataPath::Recheck() {
  if (polling_) return false;  // a kick came meanwhile
  if (!ScanDoorbells()) return false;
  n_.missed_kicks++;
  SetNeedKick(0);
  StartPolling();
  last_work_ns_ = NowNs();
  return true;
}

void DataPath::QpToErr(QpObj& q, uint16_t event, uint32_t info) {
  if (q.qp->state() != vstellar::QpState::ERR) {
    vstellar::QpAttr a;
    a.qp_state = vstellar::QpState::ERR;
    sh_->engine->modify_qp(q.qp, a, vstellar::QP_STATE);  // flushes what the engine holds, in order
  }
  events_.PostEvent(event, q.qp->qpn(), q.owner, info);
}

// A CQE the device writes itself (bad WQE, flush in ERR): the engine holds
// nothing older for this queue (ERR flushed it), so order is kept.
void DataPath::CompleteDirect(QpObj& q, bool send, uint32_t idx, uint64_t wr_id, uint8_t op, uint8_t status,
                              uint8_t vendor_err) {
  vstellar_cqe c{};
  c.vendor_err = vendor_err;
  c.wr_id = htole64(wr_id);
  c.qpn = htole32(q.qp->qpn());
  c.wqe_idx = htole16(uint16_t(idx));
  c.opcode = send ? WcOpOfSend(op) : uint8_t(VSTELLAR_WC_RECV);
  c.status = status;
  WriteCqe(send ? q.send_cqn : q.recv_cqn, c);
}

uint8_t DataPath::CheckSendWqe(QpObj& q, const uint8_t* buf, uint32_t len, vstellar::SendWr* wr, vstellar::Sge* sges,
                               uint8_t* vendor) {
  vstellar_send_wqe w;
  std::memcpy(&w, buf, sizeof(w));
  const uint8_t op = w.opcode;
  if (op > VSTELLAR_WR_BIND_MW) return CqeStatus(WcStatus::LOC_QP_OP_ERR);
  if (w.flags & ~(VSTELLAR_WQE_SIGNALED | VSTELLAR_WQE_SOLICITED | VSTELLAR_WQE_INLINE | VSTELLAR_WQE_FENCE))
    return CqeStatus(WcStatus::LOC_QP_OP_ERR);
  const bool atomic = op == VSTELLAR_WR_ATOMIC_CMP_SWP || op == VSTELLAR_WR_ATOMIC_FETCH_ADD;
  const bool inl = w.flags & VSTELLAR_WQE_INLINE;
  if (atomic && !state_.HasFeature(VIRTIO_VSTELLAR_F_ATOMIC))
    return CqeStatus(WcStatus::LOC_QP_OP_ERR);
  // The guest ABI is checked here; the verbs rules (opcode for the QP type,
  // SGE count against the QP's, inline and atomic shapes, lengths, lkeys)
  // are the engine's, in post_send.
  *wr = vstellar::SendWr{};
  wr->wr_id = 0;
  wr->opcode = EngineOp(op);
  wr->send_flags = ((w.flags & VSTELLAR_WQE_SIGNALED) ? uint32_t(vstellar::SEND_SIGNALED) : 0u) |
                   ((w.flags & VSTELLAR_WQE_SOLICITED) ? uint32_t(vstellar::SEND_SOLICITED) : 0u) |
                   ((w.flags & VSTELLAR_WQE_FENCE) ? uint32_t(vstellar::SEND_FENCE) : 0u);
  wr->imm_data = be32toh(w.imm_data);
  uint64_t total = 0;
  if (inl) {
    const uint32_t il = le32toh(w.inline_len);
    if (sizeof(w) + uint64_t(il) > len) return CqeStatus(WcStatus::LOC_LEN_ERR);
    // The engine copies inline bytes from this host pointer at post time:
    // our private copy of the slot, never guest memory.
    sges[0].addr = reinterpret_cast<uintptr_t>(buf + sizeof(w));
    sges[0].length = il;
    sges[0].lkey = 0;
    wr->sg_list = sges;
    wr->num_sge = il ? 1 : 0;
    wr->send_flags |= vstellar::SEND_INLINE;
    total = il;
  } else {
    const uint32_t n = w.num_sge;
    if (n > vstellar::DeviceLimits::kMaxSge || sizeof(w) + 16ull * n > len) return CqeStatus(WcStatus::LOC_LEN_ERR);
    for (uint32_t i = 0; i < n; i++) {
      if (uint8_t st = CheckSge(q.owner, q.pdn, buf + sizeof(w) + 16 * i, &sges[i])) return st;
      total += sges[i].length;
    }
    wr->sg_list = n ? sges : nullptr;
    wr->num_sge = n;
  }
  if (q.type == VSTELLAR_QPT_UD || q.type == VSTELLAR_QPT_GSI) {
    // A datagram goes to the WQE's address vector; its payload is bounded
    // by the device's UD limit (the engine's MTU bound is the engine's).
    if (total > VSTELLAR_UD_MAX_PAYLOAD) return CqeStatus(WcStatus::LOC_LEN_ERR);
    return CheckUdDest(w, &wr->ud);
  }
  if (op >= VSTELLAR_WR_LOCAL_INV) return CheckKeyWqe(q, w, wr, vendor);
  if (atomic) {
    wr->remote_addr = le64toh(w.u.atomic.remote_addr);
    wr->rkey = le32toh(w.u.atomic.rkey);
    wr->compare_add = le64toh(w.u.atomic.compare_add);
    wr->swap = le64toh(w.u.atomic.swap);
  } else if (op != VSTELLAR_WR_SEND && op != VSTELLAR_WR_SEND_IMM) {
    wr->remote_addr = le64toh(w.u.rdma.remote_addr);
    wr->rkey = le32toh(w.u.rdma.rkey);
  }
  return CqeStatus(WcStatus::SUCCESS);
}

// The memory-key WQEs (minor 3): LOCAL_INV, SEND_WITH_INV, REG_MR,
// BIND_MW. Their feature must be negotiated; REG_MR only on kernel QPs
// (its page list holds guest-physical addresses). The engine checks the
// keys against its objects when the WQE executes, in queue order.
uint8_t DataPath::CheckKeyWqe(QpObj& q, const vstellar_send_wqe& w, vstellar::SendWr* wr, uint8_t* vendor) {
  const bool mem_mgt = state_.HasFeature(VIRTIO_VSTELLAR_F_MEM_MGT);
  const bool windows = state_.HasFeature(VIRTIO_VSTELLAR_F_MW);
  const uint8_t op = w.opcode;
  if (q.type != VSTELLAR_QPT_RC) return CqeStatus(WcStatus::LOC_QP_OP_ERR);
  if (op != VSTELLAR_WR_SEND_WITH_INV && (w.num_sge || w.inline_len || (w.flags & VSTELLAR_WQE_INLINE)))
    return CqeStatus(WcStatus::LOC_QP_OP_ERR);
  switch (op) {
    case VSTELLAR_WR_LOCAL_INV:
    case VSTELLAR_WR_SEND_WITH_INV:
      if (!mem_mgt && !windows) return CqeStatus(WcStatus::LOC_QP_OP_ERR);
      wr->invalidate_rkey = le32toh(w.invalidate_rkey);
      wr->imm_data = 0;
      return CqeStatus(WcStatus::SUCCESS);
    case VSTELLAR_WR_REG_MR:
      if (!mem_mgt || q.owner != 0) {
        *vendor = VSTELLAR_STATUS_ACCESS;
        return CqeStatus(WcStatus::LOC_QP_OP_ERR);
      }
      return CheckFastReg(q, w, &wr->reg, vendor);
    case VSTELLAR_WR_BIND_MW: {
      if (!windows || !AllZero(w.u.bind_mw.reserved, sizeof(w.u.bind_mw.reserved))) return CqeStatus(WcStatus::LOC_QP_OP_ERR);
      vstellar::BindMwWr& b = wr->bind;
      b.mw_rkey = le32toh(w.u.bind_mw.mw_rkey);
      b.new_rkey = le32toh(w.u.bind_mw.new_rkey);
      b.mr_lkey = le32toh(w.u.bind_mw.mr_lkey);
      b.addr = le64toh(w.u.bind_mw.addr);
      b.length = le64toh(w.u.bind_mw.length);
      b.access = le32toh(w.u.bind_mw.access);
      b.mw_type = w.u.bind_mw.mw_type;
      return CqeStatus(WcStatus::SUCCESS);
    }
  }
  return CqeStatus(WcStatus::LOC_QP_OP_ERR);
}

// A REG_MR's values and page list, checked before the engine sees them: the
// MR (a fast-registration MR of the QP's PD) may map at most the pages it
// was allocated for, each an aligned page of guest RAM, read through PVDMA.
// The translation is built here, at fetch time, and installed when the WQE
// executes.
uint8_t DataPath::CheckFastReg(QpObj& q, const vstellar_send_wqe& w, vstellar::FastRegWr* reg, uint8_t* vendor) {
  const auto& r = w.u.reg_mr;
  const virtio_vstellar_config& c = state_.config();
  auto fail = [&](uint8_t why, WcStatus st) {
    *vendor = why;
    return CqeStatus(st);
  };
  if (!AllZero(r.reserved, sizeof(r.reserved))) return fail(VSTELLAR_STATUS_BAD_FIELD, WcStatus::LOC_QP_OP_ERR);
  const uint32_t key = le32toh(r.key);
  const vstellar::Mr* mr = sh_->engine->mr_by_index(key);
  if (!mr || !mr->fast_reg() || mr->pd() != q.qp->pd()) return fail(VSTELLAR_STATUS_BAD_HANDLE, WcStatus::LOC_PROT_ERR);
  const uint32_t n = le32toh(r.npages), shift = r.page_shift;
  const uint64_t iova = le64toh(r.iova), length = le64toh(r.length);
  const uint32_t access = le32toh(r.access);
  const bool windows = state_.HasFeature(VIRTIO_VSTELLAR_F_MW);
  const uint32_t allowed = VSTELLAR_ACCESS_VALID | (windows ? VSTELLAR_ACCESS_MW_BIND : 0u);
  if (n == 0 || n > mr->max_pages() || !PageShiftSupported(c, shift) ||
      length == 0 || iova + length < iova || length > le64toh(c.max_mr_size) || (access & ~allowed))
    return fail(VSTELLAR_STATUS_BAD_FIELD, WcStatus::LOC_QP_OP_ERR);
  const uint64_t ps = uint64_t{1} << shift;
  const uint64_t off = iova & (ps - 1);
  if ((off + length + ps - 1) >> shift > n) return fail(VSTELLAR_STATUS_BAD_FIELD, WcStatus::LOC_QP_OP_ERR);
  const uint64_t list = le64toh(r.page_list);
  if ((list & 7) || !pvdma_.Contains(list, 8ull * n)) return fail(VSTELLAR_STATUS_BAD_ADDRESS, WcStatus::LOC_PROT_ERR);
  MrLayout l;
  l.iova = iova;
  l.length = length;
  l.page_shift = shift;
  l.pages.resize(n);
  if (!pvdma_.Read(list, l.pages.data(), 8ull * n)) return fail(VSTELLAR_STATUS_BAD_ADDRESS, WcStatus::LOC_PROT_ERR);
  for (uint64_t& a : l.pages) {
    a = le64toh(a);
    if (a & (ps - 1)) return fail(VSTELLAR_STATUS_BAD_FIELD, WcStatus::LOC_QP_OP_ERR);
    if (!pvdma_.Contains(a, ps)) return fail(VSTELLAR_STATUS_BAD_ADDRESS, WcStatus::LOC_PROT_ERR);
  }
  uint16_t status = VSTELLAR_STATUS_OK;
  if (sh_->translation == TranslationMode::kEmtt) reg->mem = EmttTranslator::Create(pvdma_, std::move(l), &status);
  else reg->mem = AtcTranslator::Create(pvdma_, *sh_->atc, std::move(l), &status);
  if (!reg->mem) return fail(uint8_t(status ? status : uint16_t(VSTELLAR_STATUS_INTERNAL)), WcStatus::LOC_PROT_ERR);
  reg->key = key;
  reg->iova = iova;
  reg->length = length;
  reg->access = access;
  return CqeStatus(WcStatus::SUCCESS);
}

// A receive WQE of an RQ or an SRQ of context `owner`, its SGEs in PD `pdn`.
uint8_t DataPath::CheckRecvWqe(uint32_t owner, uint32_t pdn, const uint8_t* buf, uint32_t len, vstellar::RecvWr* wr,
                               vstellar::Sge* sges) {
  vstellar_recv_wqe w;
  std::memcpy(&w, buf, sizeof(w));
  const uint32_t n = le32toh(w.num_sge);
  if (n > vstellar::DeviceLimits::kMaxSge || sizeof(w) + 16ull * n > len) return CqeStatus(WcStatus::LOC_LEN_ERR);
  for (uint32_t i = 0; i < n; i++)
    if (uint8_t st = CheckSge(owner, pdn, buf + sizeof(w) + 16 * i, &sges[i])) return st;
  *wr = vstellar::RecvWr{};
  wr->sg_list = n ? sges : nullptr;
  wr->num_sge = n;
  return CqeStatus(WcStatus::SUCCESS);
}

// One SGE of a WQE, decoded. In a kernel QP the local DMA lkey names the
// PD's guest-physical MR; a user QP can never name it (that MR is in a
// kernel PD). Whether the MR is the QP's PD's and allows the access is the
// engine's check (post_send/post_recv, EngineConfig::lkeys_at_post).
uint8_t DataPath::CheckSge(uint32_t owner, uint32_t pdn, const uint8_t* raw, vstellar::Sge* out) {
  vstellar_sge s;
  std::memcpy(&s, raw, sizeof(s));
  out->addr = le64toh(s.addr);
  out->length = le32toh(s.length);
  out->lkey = le32toh(s.lkey);
  if (out->length == 0) return CqeStatus(WcStatus::SUCCESS);
  if (owner == 0 && out->lkey == VSTELLAR_LOCAL_DMA_LKEY) {
    auto pd = obj_.pds.find(pdn);
    if (pd == obj_.pds.end() || !pd->second.dma_mr) return CqeStatus(WcStatus::LOC_PROT_ERR);
    out->lkey = pd->second.dma_mr->lkey();
  }
  return CqeStatus(WcStatus::SUCCESS);
}

// The address vector of a UD send: a peer host (its IPv4 or IPv6 address
// as the GID, like an RC QP's) or a group, and a source GID the device
// itself holds, of the same family, so no guest can send as another
// address.
uint8_t DataPath::CheckUdDest(const vstellar_send_wqe& w, vstellar::UdDest* ud) {
  const vstellar_av& av = w.u.ud.av;
  const vstellar::IpAddr to = vstellar::IpAddr::from_bytes(av.dgid);
  auto sgid = obj_.gids.find(av.sgid_index);
  const uint32_t qpn = le32toh(w.u.ud.remote_qpn);
  // The source must be an address this device holds (not merely lists).
  const bool group = to.is_multicast();
  if (av.reserved[0] || av.reserved[1] || to.unspecified() || to.is_link_local() ||
      sgid == obj_.gids.end() || !HoldsGid(*sh_, &obj_, sgid->second) ||
      vstellar::IpAddr::from_bytes(sgid->second.data()).is_v4() != to.is_v4() || qpn > 0xffffff)
    return CqeStatus(WcStatus::LOC_QP_OP_ERR);
  // A multicast group (224.0.0.0/4, ff00::/8) is reached through IP
  // multicast on the port every vstellard listens on for groups
  // (docs/transport.md).
  ud->peer = vstellar::Endpoint{to, group ? sh_->mcast_port() : sh_->peer_port};
  ud->remote_qpn = qpn;
  ud->remote_qkey = le32toh(w.u.ud.remote_qkey);
  ud->sgid = sgid->second;
  std::memcpy(ud->dgid.data(), av.dgid, 16);
  ud->flow_label = be32toh(av.flow_label) & 0xFFFFF;
  ud->traffic_class = av.traffic_class;
  ud->hop_limit = av.hop_limit;
  return CqeStatus(WcStatus::SUCCESS);
}

// The SQ or the RQ of one QP: fetch every WQE the doorbell record announces,
// copy it out, check it and hand it to the engine. The two queues differ
// only in their ring, their index, their check and when they are served
// (sends from RTS on, receives from INIT on).
bool DataPath::ServiceWq(QpObj& q, uint8_t* slot, bool send, uint32_t& budget) {
  if (q.broken) return false;
  RingGeom& ring = send ? q.sq : q.rq;
  uint32_t& ci = send ? q.sq_ci : q.rq_ci;
  std::vector<uint64_t>& wrids = send ? q.sq_wrid : q.rq_wrid;
  const uint32_t pi = LoadLe32(slot + (send ? offsetof(vstellar_db_qp, sq_pi) : offsetof(vstellar_db_qp, rq_pi)));
  const uint32_t size = 1u << ring.log_n;
  const uint32_t pending = pi - ci;
  if (pending == 0) return false;
  if (pending > size) {
    // The provider claims more WQEs than the ring holds.
    std::fprintf(stderr,
                 "vstellard: device %u: QP %#x: its %s doorbell says WQE %u is posted, %u were taken: "
                 "more than the ring's %u (QP fatal)\n",
                 id_, q.qp->qpn(), send ? "send" : "receive", pi, ci, size);
    q.broken = true;
    QpToErr(q, VSTELLAR_EV_QP_FATAL, VSTELLAR_STATUS_BAD_FIELD);
    return true;
  }
  using S = vstellar::QpState;
  const S st0 = q.qp->state();
  if (st0 == S::RESET || (send && (st0 == S::INIT || st0 == S::RTR))) return false;
  alignas(16) uint8_t buf[kMaxStride];
  const uint32_t stride = 1u << ring.log_stride;
  bool work = false;
  uint32_t left = std::min(budget, sh_->wqe_budget_queue);
  while (ci != pi && !q.broken && left) {
    vstellar::Qp* e = q.qp;
    if ((send ? e->sq_room() : e->rq_room()) == 0) {  // retried after completions
      q.blocked = true;
      break;
    }
    const uint32_t idx = ci;
    work = true;
    n_.wqes++;
    left--;
    budget--;
    if (!RingRead(ring, idx, buf)) {
      std::fprintf(stderr, "vstellard: device %u: QP %#x: %s WQE %u lies outside guest memory (QP fatal)\n", id_,
                   q.qp->qpn(), send ? "send" : "receive", idx);
      q.broken = true;
      QpToErr(q, VSTELLAR_EV_QP_FATAL, VSTELLAR_STATUS_BAD_ADDRESS);
      break;
    }
    if (sh_->after_wqe_copy) sh_->after_wqe_copy(id_, e->qpn(), send, idx);
    uint64_t wr_id;  // the first field of both WQE kinds
    std::memcpy(&wr_id, buf, sizeof(wr_id));
    wr_id = le64toh(wr_id);
    const uint8_t op = send ? buf[offsetof(vstellar_send_wqe, opcode)] : 0;
    wrids[idx & (size - 1)] = wr_id;
    if (send) q.sq_op[idx & (size - 1)] = op;
    ci++;
    if (e->state() == S::ERR) {
      CompleteDirect(q, send, idx, wr_id, op, CqeStatus(WcStatus::WR_FLUSH_ERR));
      continue;
    }
    uint8_t status, vendor = 0;
    vstellar::Sge sges[vstellar::DeviceLimits::kMaxSge];
    if (send) {
      vstellar::SendWr wr;
      status = CheckSendWqe(q, buf, stride, &wr, sges, &vendor);
      wr.wr_id = idx;  // the engine's wr_id is the WQE index
      WcStatus why = WcStatus::LOC_QP_OP_ERR;
      if (status == CqeStatus(WcStatus::SUCCESS) && sh_->engine->post_send(e, wr, &why) != 0) status = CqeStatus(why);
    } else {
      vstellar::RecvWr wr;
      status = CheckRecvWqe(q.owner, q.pdn, buf, stride, &wr, sges);
      wr.wr_id = idx;
      WcStatus why = WcStatus::LOC_QP_OP_ERR;
      if (status == CqeStatus(WcStatus::SUCCESS) && sh_->engine->post_recv(e, wr, &why) != 0) status = CqeStatus(why);
    }
    if (status != CqeStatus(WcStatus::SUCCESS)) {
      n_.bad_wqes++;
      QpToErr(q, status == CqeStatus(WcStatus::LOC_PROT_ERR) ? VSTELLAR_EV_QP_ACCESS_ERR : VSTELLAR_EV_QP_FATAL, status);
      CompleteDirect(q, send, idx, wr_id, op, status, vendor);
    }
  }
  return work;
}

// RefillRecv runs inside the engine's receive path, where a QP or an SRQ
// must not change state (QpToErr would flush the queue the engine is
// taking from). So it takes only WQEs that read, check and post cleanly,
// and stops at the first that does not: the next scan of the doorbells
// takes that one and fails its QP or SRQ as usual.
void DataPath::RefillRecv(uint32_t qpn) {
  auto it = obj_.qps.find(qpn);
  if (it == obj_.qps.end() || events_.DeviceFatal()) return;
  QpObj& q = it->second;
  if (q.broken || q.slot < VSTELLAR_DB_FIRST_SLOT) return;  // kernel QPs post by command
  uint8_t* page = DbPage(q.owner);
  if (!page) return;
  const uint8_t* slot = page + VSTELLAR_DB_SLOT_SIZE * q.slot;
  vstellar::RecvWr wr;
  vstellar::Sge sges[vstellar::DeviceLimits::kMaxSge];
  uint64_t wr_id;
  if (q.srqh) {
    auto sit = obj_.srqs.find(q.srqh);
    if (sit == obj_.srqs.end() || sit->second.broken) return;
    SrqObj& s = sit->second;
    uint8_t* sslot = DbPage(s.owner);
    if (!sslot) return;
    sslot += VSTELLAR_DB_SLOT_SIZE * s.slot;
    const uint32_t pi = LoadLe32(sslot + offsetof(vstellar_db_srq, pi));
    if (pi - s.ci > (1u << s.ring.log_n)) return;  // the scan fails the SRQ
    for (uint32_t left = sh_->wqe_budget_queue; s.ci != pi && left && s.srq->room(); left--) {
      if (!TakeRecv(s.ring, s.owner, s.pdn, qpn, s.ci, &wr, sges, &wr_id) ||
          sh_->engine->post_srq_recv(s.srq, wr) != 0)
        return;
      s.wrid[s.ci++] = wr_id;
      n_.wqes++;
      n_.refilled_recvs++;
    }
    return;
  }
  const uint32_t pi = LoadLe32(slot + offsetof(vstellar_db_qp, rq_pi));
  const uint32_t size = 1u << q.rq.log_n;
  if (pi - q.rq_ci > size || q.qp->state() == vstellar::QpState::ERR) return;  // for the scan
  for (uint32_t left = sh_->wqe_budget_queue; q.rq_ci != pi && left && q.qp->rq_room(); left--) {
    if (!TakeRecv(q.rq, q.owner, q.pdn, qpn, q.rq_ci, &wr, sges, &wr_id) || sh_->engine->post_recv(q.qp, wr) != 0)
      return;
    q.rq_wrid[q.rq_ci & (size - 1)] = wr_id;
    q.rq_ci++;
    n_.wqes++;
    n_.refilled_recvs++;
  }
}

// Copies receive WQE `idx` out of `ring` and checks it (the engine's
// wr_id is the index); false if it does not read or check.
bool DataPath::TakeRecv(const RingGeom& ring, uint32_t owner, uint32_t pdn, uint32_t qpn, uint32_t idx,
                        vstellar::RecvWr* wr, vstellar::Sge* sges, uint64_t* wr_id) {
  alignas(16) uint8_t buf[kMaxStride];
  if (!RingRead(ring, idx, buf)) return false;
  if (sh_->after_wqe_copy) sh_->after_wqe_copy(id_, qpn, false, idx);
  std::memcpy(wr_id, buf, sizeof(*wr_id));
  *wr_id = le64toh(*wr_id);
  if (CheckRecvWqe(owner, pdn, buf, 1u << ring.log_stride, wr, sges) != CqeStatus(WcStatus::SUCCESS)) return false;
  wr->wr_id = idx;
  return true;
}

// An SRQ's ring, served like an RQ: fetch what its doorbell announces, copy
// each WQE out, check it against the guest ABI and hand it to the engine.
// The WQE index is the engine's wr_id. A bad WQE or record has no QP to
// fail, so the SRQ itself fails (SRQ_ERR) and is not read again; its QPs
// then see no more receives (RNR), as IB's SRQ error state.
bool DataPath::ServiceSrq(uint32_t h, SrqObj& s, uint8_t* slot, uint32_t& budget) {
  const uint32_t pi = LoadLe32(slot + offsetof(vstellar_db_srq, pi));
  const uint32_t size = 1u << s.ring.log_n;
  const uint32_t pending = pi - s.ci;
  if (pending == 0) return false;
  if (pending > size) {
    std::fprintf(stderr,
                 "vstellard: device %u: SRQ %u: its doorbell says WQE %u is posted, %u were taken: more than the "
                 "ring's %u (SRQ error)\n",
                 id_, h, pi, s.ci, size);
    SrqToErr(h, s, VSTELLAR_STATUS_BAD_FIELD);
    return true;
  }
  alignas(16) uint8_t buf[kMaxStride];
  const uint32_t stride = 1u << s.ring.log_stride;
  bool work = false;
  uint32_t left = std::min(budget, sh_->wqe_budget_queue);
  while (s.ci != pi && left) {
    if (s.srq->room() == 0) {  // retried when a QP took some (a completion)
      s.blocked = true;
      break;
    }
    const uint32_t idx = s.ci;
    work = true;
    n_.wqes++;
    left--;
    budget--;
    if (!RingRead(s.ring, idx, buf)) {
      std::fprintf(stderr, "vstellard: device %u: SRQ %u: WQE %u lies outside guest memory (SRQ error)\n", id_, h,
                   idx);
      SrqToErr(h, s, VSTELLAR_STATUS_BAD_ADDRESS);
      break;
    }
    uint64_t wr_id;
    std::memcpy(&wr_id, buf, sizeof(wr_id));
    s.wrid[idx] = le64toh(wr_id);
    s.ci++;
    vstellar::RecvWr wr;
    vstellar::Sge sges[vstellar::DeviceLimits::kMaxSge];
    uint8_t status = CheckRecvWqe(s.owner, s.pdn, buf, stride, &wr, sges);
    wr.wr_id = idx;
    WcStatus why = WcStatus::LOC_QP_OP_ERR;
    if (status == CqeStatus(WcStatus::SUCCESS) && sh_->engine->post_srq_recv(s.srq, wr, &why) != 0) status = CqeStatus(why);
    if (status != CqeStatus(WcStatus::SUCCESS)) {
      n_.bad_wqes++;
      s.wrid.erase(idx);
      SrqToErr(h, s, status);
      break;
    }
  }
  return work;
}

// RESIZE_SRQ: every WQE posted in the old ring is taken first (so none is
// left behind in it), then the engine's SRQ is resized and the ring
// replaced; indices stay free-running. Commands and the data path share
// the daemon's thread, so no doorbell is read meanwhile.
uint16_t DataPath::ResizeSrq(uint32_t h, const RingGeom& ring) {
  SrqObj& s = obj_.srqs.at(h);
  uint8_t* page = s.broken ? nullptr : DbPage(s.owner);
  if (!page) return VSTELLAR_STATUS_BAD_STATE;
  uint8_t* slot = page + VSTELLAR_DB_SLOT_SIZE * s.slot;
  for (;;) {
    uint32_t budget = UINT32_MAX;
    const uint32_t before = s.ci;
    ServiceSrq(h, s, slot, budget);
    if (s.broken) return VSTELLAR_STATUS_BAD_STATE;
    if (s.ci == LoadLe32(slot + offsetof(vstellar_db_srq, pi))) break;
    // The engine's SRQ is full: more WQEs outstanding than the SRQ holds.
    if (s.ci == before) return VSTELLAR_STATUS_BAD_STATE;
  }
  if (sh_->engine->resize_srq(s.srq, 1u << ring.log_n)) return VSTELLAR_STATUS_BAD_FIELD;
  s.ring = ring;
  s.blocked = false;
  return VSTELLAR_STATUS_OK;
}

void DataPath::SrqToErr(uint32_t h, SrqObj& s, uint32_t info) {
  s.broken = true;
  events_.PostEvent(VSTELLAR_EV_SRQ_ERR, h, s.owner, info);
}

// Engine completions -> guest CQEs. The engine's wr_id is the WQE index.
void DataPath::DrainCq(uint32_t cqh) {
  auto it = obj_.cqs.find(cqh);
  if (it == obj_.cqs.end()) return;
  vstellar::Cq* ecq = it->second.cq;
  vstellar::Wc wcs[32];
  bool blocked = false;
  for (int n; (n = ecq->poll(wcs, 32)) > 0;) {
    for (int i = 0; i < n; i++) {
      const vstellar::Wc& wc = wcs[i];
      auto qit = obj_.qps.find(wc.qp_num);
      if (qit == obj_.qps.end()) continue;  // QP destroyed meanwhile
      QpObj& q = qit->second;
      const bool recv = uint8_t(wc.opcode) & 0x80;
      const uint32_t idx = uint32_t(wc.wr_id);
      // The first error of a QP is what ended it: the log says which, so
      // that a guest's "QP fatal" can be told apart (transport retries,
      // a remote error, a local one) without a debugger.
      if (wc.status != vstellar::WcStatus::SUCCESS && wc.status != vstellar::WcStatus::WR_FLUSH_ERR &&
          !q.error_logged) {
        q.error_logged = true;
        // With the QP's transport state (RTT, RTO, what it waits for,
        // how long since its peer answered): a retry limit reached on a
        // loaded host is told apart from a peer gone.
        std::fprintf(stderr, "vstellard: device %u: QP %#x: a %s completed with %s (vendor %u): %s\n", id_,
                     wc.qp_num, recv ? "receive" : "send", vstellar::to_string(wc.status), unsigned(wc.vendor_err),
                     sh_->engine->describe_qp(wc.qp_num).c_str());
      }
      vstellar_cqe c{};
      c.qpn = htole32(wc.qp_num);
      c.byte_len = htole32(wc.byte_len);
      c.wqe_idx = htole16(uint16_t(idx));
      c.opcode = uint8_t(wc.opcode);
      c.status = uint8_t(wc.status);
      c.vendor_err = uint8_t(wc.vendor_err);
      if (recv) {
        if (q.recv_cqn != cqh) continue;
        if (wc.wc_flags & vstellar::WC_SRQ) {
          // From the QP's SRQ: wqe_idx names the SRQ slot.
          auto s = obj_.srqs.find(q.srqh);
          if (s == obj_.srqs.end()) continue;
          auto w = s->second.wrid.find(idx);
          if (w == s->second.wrid.end()) continue;
          c.wr_id = htole64(w->second);
          s->second.wrid.erase(w);
          c.wc_flags |= VSTELLAR_CQE_SRQ;
          if (s->second.blocked) {  // a QP took WQEs: the engine's SRQ has room again
            s->second.blocked = false;
            blocked = true;
          }
        } else {
          if (q.rq_wrid.empty()) continue;
          c.wr_id = htole64(q.rq_wrid[idx & (q.rq_wrid.size() - 1)]);
        }
        c.src_qp = htole32(wc.src_qp);
        if (wc.wc_flags & vstellar::WC_GRH) c.wc_flags |= VSTELLAR_CQE_GRH;
        if (wc.wc_flags & vstellar::WC_GRH_IPV4) c.wc_flags |= VSTELLAR_CQE_GRH_IPV4;
        if (wc.wc_flags & vstellar::WC_WITH_IMM) {
          c.wc_flags |= VSTELLAR_CQE_WITH_IMM;
          c.imm_data = htobe32(wc.imm_data);
        } else if (wc.wc_flags & vstellar::WC_WITH_INV) {
          c.wc_flags |= VSTELLAR_CQE_WITH_INV;
          c.invalidated_rkey = htole32(wc.imm_data);
        }
      } else {
        if (q.send_cqn != cqh || q.sq_wrid.empty()) continue;
        c.wr_id = htole64(q.sq_wrid[idx & (q.sq_wrid.size() - 1)]);
      }
      if (q.blocked) {
        q.blocked = false;
        blocked = true;
      }
      WriteCqe(cqh, c);
    }
  }
  // Completions freed engine SQ room: WQEs waiting for it are picked up.
  if (blocked) StartPolling();
}

// Guest-physical address of CQE `idx` (free-running) of a CQ's ring. A CQE
// never spans pages: the ring starts 32-byte aligned and pages are at
// least 4 KiB.
uint64_t DataPath::CqeGpa(const CqObj& cq, uint32_t idx) {
  const uint64_t ps = uint64_t{1} << cq.page_shift;
  const uint64_t off = cq.ring_offset + uint64_t(idx & ((1u << cq.log_cqe) - 1)) * sizeof(vstellar_cqe);
  return cq.pages[off >> cq.page_shift] + (off & (ps - 1));
}

// RESIZE_CQ: the CQEs the guest has not polled yet, [ci, pi) of the old
// ring, go to entries 0 .. n - 1 of the new ring (pass 0: owner bit 1),
// the slot's ci goes back to 0, and the next CQE is written at entry n.
// The CQ is unchanged unless every step succeeded. Commands and the data
// path run on the daemon's one thread, so no CQE is written meanwhile.
uint16_t DataPath::ResizeCq(uint32_t cqh, const CqObj& geom, uint32_t* moved) {
  CqObj& cq = obj_.cqs.at(cqh);
  *moved = 0;
  if (cq.slot < VSTELLAR_DB_FIRST_SLOT) return VSTELLAR_STATUS_BAD_STATE;
  uint8_t* page = DbPage(cq.owner);
  if (!page) return VSTELLAR_STATUS_BAD_STATE;
  uint8_t* slot = page + VSTELLAR_DB_SLOT_SIZE * cq.slot;
  const uint32_t ci = LoadLe32(slot + offsetof(vstellar_db_cq, ci));
  const uint32_t n = cq.pi - ci;
  if (n > (1u << cq.log_cqe)) return VSTELLAR_STATUS_BAD_STATE;  // ci ahead of pi, or a lap behind
  if (n > (1u << geom.log_cqe)) return VSTELLAR_STATUS_LIMIT;
  for (uint32_t k = 0; k < n; k++) {
    vstellar_cqe c;
    if (!pvdma_.Read(CqeGpa(cq, ci + k), &c, sizeof(c))) return VSTELLAR_STATUS_BAD_ADDRESS;
    c.owner = VSTELLAR_CQE_OWNER;
    const uint64_t gpa = CqeGpa(geom, k);
    if (!pvdma_.Write(gpa, &c, offsetof(vstellar_cqe, owner))) return VSTELLAR_STATUS_BAD_ADDRESS;
    std::atomic_thread_fence(std::memory_order_release);
    if (!pvdma_.Write(gpa + offsetof(vstellar_cqe, owner), &c.owner, 1)) return VSTELLAR_STATUS_BAD_ADDRESS;
  }
  cq.pages = geom.pages;
  cq.page_shift = geom.page_shift;
  cq.ring_offset = geom.ring_offset;
  cq.log_cqe = geom.log_cqe;
  cq.pi = n;
  StoreDb(cq.owner, slot + offsetof(vstellar_db_cq, ci), 0);
  n_.cq_resizes++;
  *moved = n;
  return VSTELLAR_STATUS_OK;
}

uint32_t DataPath::MissingCqes(const CqObj& cq, uint32_t ci, uint32_t* first) {
  uint32_t missing = 0;
  if (cq.pi - ci > (1u << cq.log_cqe)) return 0;  // a guest's bad index: not ours to judge here
  for (uint32_t i = ci; i != cq.pi; i++) {
    uint8_t owner = 0;
    const uint8_t want = ((i >> cq.log_cqe) & 1) ? 0 : VSTELLAR_CQE_OWNER;
    if (!pvdma_.Read(CqeGpa(cq, i) + offsetof(vstellar_cqe, owner), &owner, 1) ||
        (owner & VSTELLAR_CQE_OWNER) != want) {
      if (!missing++ && first) *first = i;
    }
  }
  return missing;
}

unsigned DataPath::CheckCqRings(const char* when) {
  unsigned bad = 0;
  for (const auto& [h, cq] : obj_.cqs) {
    if (cq.slot < VSTELLAR_DB_FIRST_SLOT || cq.overflow) continue;
    uint8_t* page = DbPage(cq.owner);
    if (!page) continue;
    const uint32_t ci = LoadLe32(page + VSTELLAR_DB_SLOT_SIZE * cq.slot + offsetof(vstellar_db_cq, ci));
    uint32_t first = 0;
    if (const uint32_t missing = MissingCqes(cq, ci, &first)) {
      bad++;
      std::fprintf(stderr,
                   "vstellard: device %u: CQ %u %s: %u of the %u CQEs written and not polled are not in guest "
                   "memory (the first: CQE %u)\n",
                   id_, h, when, missing, cq.pi - ci, first);
    }
  }
  return bad;
}

void DataPath::WriteCqe(uint32_t cqh, vstellar_cqe& c) {
  auto it = obj_.cqs.find(cqh);
  if (it == obj_.cqs.end()) return;
  CqObj& cq = it->second;
  if (cq.overflow) return;
  const uint32_t entries = 1u << cq.log_cqe;
  uint8_t* slot = nullptr;
  if (cq.slot >= VSTELLAR_DB_FIRST_SLOT) {
    uint8_t* page = DbPage(cq.owner);
    if (page) slot = page + VSTELLAR_DB_SLOT_SIZE * cq.slot;
    const uint32_t ci = slot ? LoadLe32(slot + offsetof(vstellar_db_cq, ci)) : cq.pi;
    if (cq.pi - ci >= entries) {
      cq.overflow = true;
      n_.cq_overflows++;
      events_.PostEvent(VSTELLAR_EV_CQ_ERR, cqh, cq.owner, 0);
      return;
    }
  }
  const uint64_t gpa = CqeGpa(cq, cq.pi);
  c.owner = ((cq.pi >> cq.log_cqe) & 1) ? 0 : VSTELLAR_CQE_OWNER;
  if (!pvdma_.Write(gpa, &c, offsetof(vstellar_cqe, owner))) {
    cq.overflow = true;
    events_.PostEvent(VSTELLAR_EV_CQ_ERR, cqh, cq.owner, VSTELLAR_STATUS_BAD_ADDRESS);
    return;
  }
  std::atomic_thread_fence(std::memory_order_release);
  pvdma_.Write(gpa + offsetof(vstellar_cqe, owner), &c.owner, 1);
  cq.pi++;
  n_.cqes++;
  // Notification: a CQ with a doorbell slot is armed while the slot's arm
  // differs from the value last consumed; a slotless kernel CQ through
  // REQ_NOTIFY_CQ. The full fence orders the CQE store before the arm load
  // (the driver stores arm, fences, then looks for a CQE): one side sees
  // the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool fire = false;
  if (slot) {
    const uint32_t arm = LoadLe32(slot + offsetof(vstellar_db_cq, arm));
    if (arm != cq.last_arm) {
      cq.last_arm = arm;
      fire = true;
    }
  } else if (cq.armed) {
    cq.armed = false;
    fire = true;
  }
  if (fire) {
    vstellar_cq_notify nt{htole32(cqh), htole32(cq.owner)};
    events_.NotifyCq(cq.cq_queue, nt);
  }
}

std::vector<std::string> DataPath::Describe() {
  std::vector<std::string> out;
  char b[256];
  for (auto& [qpn, q] : obj_.qps) {
    uint8_t* page = q.slot >= VSTELLAR_DB_FIRST_SLOT ? DbPage(q.owner) : nullptr;
    uint8_t* slot = page ? page + VSTELLAR_DB_SLOT_SIZE * q.slot : nullptr;
    const long long sq_pi = slot ? (long long)LoadLe32(slot + offsetof(vstellar_db_qp, sq_pi)) : -1;
    const long long rq_pi = slot ? (long long)LoadLe32(slot + offsetof(vstellar_db_qp, rq_pi)) : -1;
    std::snprintf(b, sizeof b,
                  "device=%u qpn=%u guest_sq_pi=%lld sq_fetched=%u guest_rq_pi=%lld rq_fetched=%u srq=%u "
                  "blocked=%d broken=%d polling=%d",
                  id_, qpn, sq_pi, q.sq_ci, rq_pi, q.rq_ci, q.srqh, int(q.blocked), int(q.broken),
                  int(polling_));
    out.push_back(b);
  }
  for (auto& [h, cq] : obj_.cqs) {
    uint8_t* page = cq.slot >= VSTELLAR_DB_FIRST_SLOT ? DbPage(cq.owner) : nullptr;
    const long long ci =
        page ? (long long)LoadLe32(page + VSTELLAR_DB_SLOT_SIZE * cq.slot + offsetof(vstellar_db_cq, ci)) : -1;
    // missing: CQEs written and not polled whose owner bit is not in guest
    // memory (CheckCqRings); a guest waits on the first for ever.
    const uint32_t missing = ci >= 0 && !cq.overflow ? MissingCqes(cq, uint32_t(ci), nullptr) : 0;
    std::snprintf(b, sizeof b, "device=%u cq=%u written=%u guest_ci=%lld entries=%u overflow=%d missing=%u", id_, h,
                  cq.pi, ci, 1u << cq.log_cqe, int(cq.overflow), missing);
    out.push_back(b);
  }
  return out;
}

void DataPath::OnQpModified(QpObj& q, uint8_t next) {
  if (next == VSTELLAR_QPS_RESET) {
    // RESET forgets every WQE: both sides restart at index 0.
    q.sq_ci = q.rq_ci = 0;
    q.broken = false;
    ResetDbSlot(q.owner, q.slot);
  }
  // WQEs posted before RTS (SQ) or INIT (RQ) are picked up now.
  if (q.slot >= VSTELLAR_DB_FIRST_SLOT && next != VSTELLAR_QPS_RESET) {
    SetNeedKick(0);
    StartPolling();
    last_work_ns_ = NowNs();
  }
}

}  // namespace vstellard
