// Memory keys: MR and window keys, fast registration, invalidation and
// window binding. The rules are IB's (IBTA vol. 1, 10.6 and 10.7); see
// docs/engine.md ("Memory keys") for the choices where IB leaves room.
#include "engine_internal.h"

namespace vstellar {

namespace {

constexpr uint32_t kIndexMask = 0xFFFFFF;
constexpr uint32_t kRemoteRights = ACCESS_REMOTE_READ | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC;

WcStatus Fail(uint32_t* vendor, uint32_t why, WcStatus st) {
  *vendor = why;
  return st;
}

}  // namespace

// Index 0 is never used, so no key is 0 (the local DMA lkey of the device).
// With several engines in a process (EngineConfig::qpn_shards), an
// engine's key indices are those of its shard, so an MR moving between
// engines (move.cc) keeps its key and meets no other with that index.
uint32_t EngineCore::alloc_key() {
  const uint32_t shards = cfg_.qpn_shards;
  const size_t space = (kIndexMask + 1) / shards;
  if (mrs_.size() + mws_.size() + lent_keys_.size() >= space / 2) return 0;  // keep lookups of a guess cheap to refuse
  for (;;) {
    const uint64_t r = key_random_.Next();
    const uint32_t index = (uint32_t(r >> 8) & kIndexMask) / shards * shards + cfg_.qpn_shard;
    if (index == 0 || index > kIndexMask || mrs_.count(index) || mws_.count(index) || lent_keys_.count(index))
      continue;
    return index << 8 | uint32_t(r & 0xFF);
  }
}

Mr* EngineCore::remote_mr(const QpImpl& qp, uint32_t rkey, uint64_t va, uint64_t len, uint32_t need) {
  if (Mr* mr = find_mr(rkey)) return mr->pd() == qp.pd() && mr->allows(va, len, need) ? mr : nullptr;
  auto it = mws_.find(rkey >> 8);
  if (it == mws_.end()) return nullptr;
  const Mw& w = *it->second;
  if (w.rkey_ != rkey || w.state_ != MrState::VALID || !w.mr_ || w.pd_ != qp.pd()) return nullptr;
  if (w.type_ == 2 && w.qpn_ != qp.qpn_) return nullptr;  // type 2B: only through the QP it was bound on
  if ((w.access_ & need) != need) return nullptr;
  if (va < w.addr_ || va - w.addr_ > w.length_ || len > w.length_ - (va - w.addr_)) return nullptr;
  return w.mr_->allows(va, len, 0) ? w.mr_ : nullptr;
}

void EngineCore::unbind(Mw& mw) {
  if (mw.mr_) mw.mr_->bound_windows_--;
  mw.mr_ = nullptr;
  mw.addr_ = mw.length_ = 0;
  mw.access_ = 0;
  mw.qpn_ = 0;
}

void EngineCore::invalidate_qp_windows(const QpImpl& qp) {
  for (auto& [index, mw] : mws_) {
    if (mw->type_ != 2 || mw->state_ != MrState::VALID || mw->qpn_ != qp.qpn_ || mw->pd_ != qp.pd()) continue;
    unbind(*mw);
    mw->state_ = MrState::INVALID;
  }
}

WcStatus EngineCore::invalidate(QpImpl& qp, uint32_t key, bool remote, bool check_only, uint32_t* vendor) {
  if (Mr* mr = mr_by_index(key)) {
    // Only fast-registration MRs can be invalidated (IB 10.6.5).
    if (!mr->fast_reg_ || mr->pd_ != qp.pd()) return Fail(vendor, VENDOR_BAD_HANDLE, WcStatus::LOC_PROT_ERR);
    if (mr->key_ != key) return Fail(vendor, VENDOR_ACCESS, WcStatus::LOC_PROT_ERR);
    if (remote && mr->state_ != MrState::VALID) return Fail(vendor, VENDOR_BAD_STATE, WcStatus::LOC_PROT_ERR);
    // Windows bound to it would keep its old pages reachable.
    if (mr->bound_windows_) return Fail(vendor, VENDOR_BUSY, WcStatus::LOC_QP_OP_ERR);
    if (!check_only && mr->state_ == MrState::VALID) {
      mr->state_ = MrState::INVALID;
      mr->mem_.reset();  // its translation goes with the registration
    }
    return WcStatus::SUCCESS;
  }
  auto it = mws_.find(key >> 8);
  if (it == mws_.end() || it->second->pd_ != qp.pd()) return Fail(vendor, VENDOR_BAD_HANDLE, WcStatus::LOC_PROT_ERR);
  Mw& mw = *it->second;
  if (mw.type_ != 2) return Fail(vendor, VENDOR_BAD_STATE, WcStatus::LOC_QP_OP_ERR);  // type 1: unbind by binding
  if (mw.rkey_ != key) return Fail(vendor, VENDOR_ACCESS, WcStatus::LOC_PROT_ERR);
  if (mw.state_ == MrState::VALID && mw.qpn_ != qp.qpn_) return Fail(vendor, VENDOR_ACCESS, WcStatus::LOC_PROT_ERR);
  if (remote && mw.state_ != MrState::VALID) return Fail(vendor, VENDOR_BAD_STATE, WcStatus::LOC_PROT_ERR);
  if (!check_only && mw.state_ == MrState::VALID) {
    unbind(mw);
    mw.state_ = MrState::INVALID;
  }
  return WcStatus::SUCCESS;
}

WcStatus EngineCore::exec_local(QpImpl& qp, SendWqe& w, uint32_t* vendor) {
  switch (w.op) {
    case WrOpcode::REG_MR: {
      FastRegWr& r = w.reg;
      Mr* mr = mr_by_index(r.key);
      if (!mr || !mr->fast_reg_ || mr->pd_ != qp.pd()) return Fail(vendor, VENDOR_BAD_HANDLE, WcStatus::LOC_PROT_ERR);
      if (mr->state_ == MrState::VALID) return Fail(vendor, VENDOR_BAD_STATE, WcStatus::LOC_QP_OP_ERR);
      if (!r.mem || r.length == 0 || r.iova + r.length < r.iova || (r.access & ~ACCESS_MR_SUPPORTED) ||
          ((r.access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC)) && !(r.access & ACCESS_LOCAL_WRITE)))
        return Fail(vendor, VENDOR_BAD_FIELD, WcStatus::LOC_QP_OP_ERR);
      mr->key_ = r.key;
      mr->iova_ = r.iova;
      mr->length_ = r.length;
      mr->access_ = r.access;
      mr->mem_ = std::move(r.mem);
      mr->state_ = MrState::VALID;
      return WcStatus::SUCCESS;
    }
    case WrOpcode::LOCAL_INV:
      return invalidate(qp, w.rkey, /*remote=*/false, /*check_only=*/false, vendor);
    case WrOpcode::BIND_MW: {
      const BindMwWr& b = w.bind;
      auto it = mws_.find(b.mw_rkey >> 8);
      if (it == mws_.end() || it->second->pd_ != qp.pd()) return Fail(vendor, VENDOR_BAD_HANDLE, WcStatus::MW_BIND_ERR);
      Mw& mw = *it->second;
      if (mw.rkey_ != b.mw_rkey) return Fail(vendor, VENDOR_ACCESS, WcStatus::MW_BIND_ERR);
      if (b.mw_type != mw.type_ || (b.new_rkey >> 8) != (mw.rkey_ >> 8) || (b.access & ~kRemoteRights))
        return Fail(vendor, VENDOR_BAD_FIELD, WcStatus::MW_BIND_ERR);
      // Type 2 binds only when FREE or INVALID (IB o10-37.2.30).
      if (mw.type_ == 2 && mw.state_ == MrState::VALID) return Fail(vendor, VENDOR_BAD_STATE, WcStatus::MW_BIND_ERR);
      if (b.length == 0) {
        if (mw.type_ == 2) return Fail(vendor, VENDOR_BAD_FIELD, WcStatus::MW_BIND_ERR);
        unbind(mw);
        mw.rkey_ = b.new_rkey;
        return WcStatus::SUCCESS;
      }
      Mr* mr = find_mr(b.mr_lkey);
      if (!mr || mr->pd_ != qp.pd()) return Fail(vendor, VENDOR_BAD_HANDLE, WcStatus::MW_BIND_ERR);
      if (!(mr->access_ & ACCESS_MW_BIND) ||
          ((b.access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_ATOMIC)) && !(mr->access_ & ACCESS_LOCAL_WRITE)) ||
          !mr->allows(b.addr, b.length, 0))
        return Fail(vendor, VENDOR_ACCESS, WcStatus::MW_BIND_ERR);
      unbind(mw);
      mw.mr_ = mr;
      mr->bound_windows_++;
      mw.addr_ = b.addr;
      mw.length_ = b.length;
      mw.access_ = b.access;
      mw.rkey_ = b.new_rkey;
      mw.qpn_ = mw.type_ == 2 ? qp.qpn_ : 0;
      mw.state_ = MrState::VALID;
      return WcStatus::SUCCESS;
    }
    default:
      return Fail(vendor, VENDOR_BAD_FIELD, WcStatus::LOC_QP_OP_ERR);
  }
}

}  // namespace vstellar
