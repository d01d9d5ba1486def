#include "vstellar/ns3/workload.h"

#include <ns3/simulator.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

namespace vstellar::ns3sim {

using namespace ns3;

// One host's verbs objects: a PD, one CQ for all its QPs, one MR over a
// buffer that holds the source slots of its outgoing connections and the
// target slots of its incoming ones.
struct Workload::HostState {
  Pd* pd = nullptr;
  Cq* cq = nullptr;
  Mr* mr = nullptr;
  std::vector<uint8_t> buf;
  size_t used = 0;  // bytes of buf handed out
  std::vector<Conn*> out;  // connections this host sends on
  uint64_t addr(size_t off) { return uint64_t(uintptr_t(buf.data() + off)); }
};

struct Workload::Conn {
  uint32_t index = 0;
  uint32_t src = 0, dst = 0;
  Qp* sqp = nullptr;  // on src
  Qp* dqp = nullptr;  // on dst
  size_t src_off = 0, dst_off = 0;  // slot 0 of each side
  uint32_t slots = 0;
  uint64_t posted = 0;
  bool done = false;
  int32_t after = -1;             // Workload::chain
  std::vector<Conn*> dependents;  // connections that wait for this one
};

namespace {

constexpr uint32_t kAccess = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;

int to_init(Engine& e, Qp* qp) {
  QpAttr at;
  at.qp_state = QpState::INIT;
  at.pkey_index = 0;
  at.port_num = 1;
  at.qp_access_flags = kAccess;
  return e.modify_qp(qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS);
}

int to_rtr(Engine& e, Qp* qp, uint32_t peer_ip, uint32_t peer_qpn, uint32_t rq_psn) {
  QpAttr at;
  at.qp_state = QpState::RTR;
  at.path_mtu = MTU_4096;
  at.dest_qp_num = peer_qpn;
  at.rq_psn = rq_psn;
  at.max_dest_rd_atomic = 16;
  at.min_rnr_timer = 1;
  at.ah = Endpoint{peer_ip, kEnginePort};
  return e.modify_qp(qp, at,
                     QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN |
                         QP_MAX_DEST_RD_ATOMIC | QP_MIN_RNR_TIMER);
}

int to_rts(Engine& e, Qp* qp, uint32_t sq_psn) {
  QpAttr at;
  at.qp_state = QpState::RTS;
  at.sq_psn = sq_psn;
  at.timeout = 14;  // IB's deadline 0.54 s with retry_cnt 7 (transport.md)
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 16;
  return e.modify_qp(qp, at,
                     QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY |
                         QP_MAX_QP_RD_ATOMIC);
}

void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = r();
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
}

}  // namespace

Workload::Workload(Fabric& fabric, const WorkloadOptions& opt,
                   const std::vector<std::pair<uint32_t, uint32_t>>& conns)
    : fab_(fabric), opt_(opt) {
  uint32_t n = fab_.hosts();
  size_t slot_bytes = size_t(opt_.msg_bytes);
  uint32_t slots = std::max<uint32_t>(1, opt_.depth);
  std::vector<uint32_t> uses(n, 0);
  for (auto [s, d] : conns) {
    NS_ABORT_MSG_IF(s >= n || d >= n || s == d, "bad connection " << s << " -> " << d);
    uses[s]++;
    uses[d]++;
  }
  for (uint32_t h = 0; h < n; h++) {
    EngineConfig c = opt_.engine;
    // Each engine its own random streams, repeatable from run to run.
    c.seed = opt_.seed * 1000003 + h;
    c.qpn_seed = c.seed;
    c.key_seed = c.seed + 7;
    hosts_.push_back(std::make_unique<Ns3Host>(fab_.host_node(h), Ipv4Address(fab_.host_ip(h)), c));
    auto st = std::make_unique<HostState>();
    Engine& e = hosts_.back()->engine();
    st->pd = e.alloc_pd();
    st->cq = e.create_cq(std::max<uint32_t>(64, uses[h] * slots * 2));
    st->buf.assign(std::max<size_t>(4096, uses[h] * slots * slot_bytes), 0);
    st->mr = e.reg_mr(st->pd, st->addr(0), st->buf.size(), kAccess, std::make_shared<HostMemory>());
    NS_ABORT_MSG_IF(!st->mr, "reg_mr failed on host " << h);
    hs_.push_back(std::move(st));
    hosts_.back()->after_pass = [this, h] { poll(h); };
  }
  for (auto [s, d] : conns) {
    auto c = std::make_unique<Conn>();
    c->index = uint32_t(conns_.size());
    c->src = s;
    c->dst = d;
    c->slots = slots;
    Engine& es = hosts_[s]->engine();
    Engine& ed = hosts_[d]->engine();
    QpInitAttr ia;
    ia.cap.max_send_wr = slots + 1;
    ia.cap.max_recv_wr = 1;
    ia.send_cq = ia.recv_cq = hs_[s]->cq;
    c->sqp = es.create_qp(hs_[s]->pd, ia);
    ia.send_cq = ia.recv_cq = hs_[d]->cq;
    c->dqp = ed.create_qp(hs_[d]->pd, ia);
    NS_ABORT_MSG_IF(!c->sqp || !c->dqp, "create_qp failed");
    uint32_t psn_s = 1000 + c->index, psn_d = 5000 + c->index;
    int rc = to_init(es, c->sqp) | to_init(ed, c->dqp) |
             to_rtr(es, c->sqp, fab_.host_ip(d), c->dqp->qpn(), psn_d) |
             to_rtr(ed, c->dqp, fab_.host_ip(s), c->sqp->qpn(), psn_s) | to_rts(es, c->sqp, psn_s) |
             to_rts(ed, c->dqp, psn_d);
    NS_ABORT_MSG_IF(rc != 0, "modify_qp failed for connection " << s << " -> " << d);
    c->src_off = hs_[s]->used;
    hs_[s]->used += slots * slot_bytes;
    c->dst_off = hs_[d]->used;
    hs_[d]->used += slots * slot_bytes;
    fill_random(hs_[s]->buf.data() + c->src_off, slots * slot_bytes, opt_.seed * 7919 + c->index);
    ConnectionResult r;
    r.src = s;
    r.dst = d;
    results_.push_back(r);
    hs_[s]->out.push_back(c.get());
    conns_.push_back(std::move(c));
  }
}

Workload::~Workload() {
  // The hosts' engines go before the ns-3 objects they send through.
  hosts_.clear();
}

void Workload::chain(const std::vector<int32_t>& after) {
  NS_ABORT_MSG_IF(after.size() != conns_.size(), "chain: one entry per connection");
  for (size_t i = 0; i < after.size(); i++) {
    if (after[i] < 0) continue;
    NS_ABORT_MSG_IF(size_t(after[i]) >= conns_.size() || size_t(after[i]) == i, "chain: bad connection");
    conns_[i]->after = after[i];
    conns_[size_t(after[i])]->dependents.push_back(conns_[i].get());
  }
}

void Workload::start(Conn& c) {
  post(c);
  hosts_[c.src]->kick();
}

// Keep `depth` WRITEs outstanding; message i goes from source slot i % slots
// to the same target slot.
void Workload::post(Conn& c) {
  HostState& s = *hs_[c.src];
  HostState& d = *hs_[c.dst];
  ConnectionResult& r = results_[c.index];
  while (!c.done && (opt_.messages == 0 || c.posted < opt_.messages) &&
         c.posted - r.completed - r.failed < opt_.depth &&
         (c.after < 0 || results_[size_t(c.after)].completed >= c.posted)) {
    size_t off = size_t(c.posted % c.slots) * opt_.msg_bytes;
    Sge sg{s.addr(c.src_off + off), opt_.msg_bytes, s.mr->lkey()};
    SendWr wr;
    wr.wr_id = uint64_t(c.index) << 32 | uint32_t(c.posted);
    wr.opcode = WrOpcode::RDMA_WRITE;
    wr.send_flags = SEND_SIGNALED;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.remote_addr = d.addr(c.dst_off + off);
    wr.rkey = d.mr->rkey();
    if (hosts_[c.src]->engine().post_send(c.sqp, wr) != 0) break;
    c.posted++;
  }
}

void Workload::poll(uint32_t h) {
  Wc wc[64];
  int k;
  while ((k = hosts_[h]->engine().poll_cq(hs_[h]->cq, wc, 64)) > 0) {
    for (int i = 0; i < k; i++) {
      uint32_t ci = uint32_t(wc[i].wr_id >> 32);
      if (ci >= conns_.size() || conns_[ci]->src != h) continue;
      Conn& c = *conns_[ci];
      ConnectionResult& r = results_[ci];
      if (wc[i].status == WcStatus::SUCCESS) {
        r.completed++;
        r.bytes += opt_.msg_bytes;
        if (opt_.series_bin_ns) {
          const size_t bin = size_t(uint64_t(Simulator::Now().GetNanoSeconds()) / opt_.series_bin_ns);
          if (series_.size() <= bin) series_.resize(bin + 1);
          series_[bin] += opt_.msg_bytes;
        }
      } else {
        if (!r.failed) r.first_error = uint64_t(wc[i].status);
        r.failed++;
      }
      r.finish_ns = uint64_t(Simulator::Now().GetNanoSeconds());
      if (opt_.messages && r.completed + r.failed >= opt_.messages) finish(c);
      // The next step of those waiting for this one may go.
      for (Conn* d : c.dependents) {
        if (d->done) continue;
        const uint64_t before = d->posted;
        post(*d);
        if (d->posted != before) hosts_[d->src]->kick();
      }
    }
    // WRITEs posted here go out in another pass at once: this runs after
    // the engine's pass (Ns3Host::after_pass), whose next deadline knows
    // nothing of them, so without the kick they waited for the next
    // datagram or timer.
    bool posted = false;
    for (Conn* c : hs_[h]->out) {
      if (c->done) continue;
      const uint64_t before = c->posted;
      post(*c);
      posted |= c->posted != before;
    }
    if (posted) hosts_[h]->kick();
  }
}

void Workload::finish(Conn& c) {
  if (c.done) return;
  c.done = true;
  ConnectionResult& r = results_[c.index];
  uint64_t written = std::min<uint64_t>(c.slots, r.completed);
  size_t len = size_t(written) * opt_.msg_bytes;
  r.verified = r.failed == 0 && written > 0 &&
               std::memcmp(hs_[c.src]->buf.data() + c.src_off, hs_[c.dst]->buf.data() + c.dst_off,
                           len) == 0;
  if (++done_ == conns_.size()) Simulator::Stop();
}

void Workload::run() {
  for (auto& c : conns_) {
    Conn* cp = c.get();
    Simulator::Schedule(NanoSeconds(int64_t(opt_.start_ns)), [this, cp] { start(*cp); });
  }
  Simulator::Stop(NanoSeconds(int64_t(opt_.stop_ns)));
  Simulator::Run();
  end_ns_ = uint64_t(Simulator::Now().GetNanoSeconds());
  for (auto& c : conns_)
    if (!opt_.messages) finish(*c);  // a timed run: check what completed
}

EngineStats Workload::engine_totals() const {
  EngineStats t;
  for (auto& h : hosts_) {
    const EngineStats& s = h->engine().stats();
    t.tx_pkts += s.tx_pkts;
    t.rx_pkts += s.rx_pkts;
    t.data_pkts_sent += s.data_pkts_sent;
    t.retx_pkts += s.retx_pkts;
    t.timeouts += s.timeouts;
    t.spurious_timeouts += s.spurious_timeouts;
    t.path_gap_losses += s.path_gap_losses;
    t.quiet_losses += s.quiet_losses;
    t.quiet_probes += s.quiet_probes;
    t.overdue_losses += s.overdue_losses;
    t.overdue_wrong += s.overdue_wrong;
    t.paths_set_aside += s.paths_set_aside;
    t.path_probes += s.path_probes;
    t.ce_marks += s.ce_marks;
    t.dup_pkts += s.dup_pkts;
    t.audit_failures += s.audit_failures;
  }
  return t;
}

std::vector<std::pair<uint32_t, uint32_t>> ring(uint32_t hosts, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<uint32_t> place(hosts);
  std::iota(place.begin(), place.end(), 0);
  std::shuffle(place.begin(), place.end(), r);
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (uint32_t k = 0; k < hosts; k++) out.emplace_back(place[k], place[(k + 1) % hosts]);
  return out;
}

std::vector<int32_t> ring_after(uint32_t hosts) {
  std::vector<int32_t> after(hosts);
  for (uint32_t k = 0; k < hosts; k++) after[k] = int32_t((k + hosts - 1) % hosts);
  return after;
}

std::vector<std::pair<uint32_t, uint32_t>> permutation(uint32_t hosts, uint32_t hosts_per_tor,
                                                       uint64_t seed) {
  // A random permutation, then repaired: a host that sends to itself or
  // (with more than one ToR) under its own ToR swaps targets with a random
  // host for which the swap breaks neither rule.
  std::mt19937_64 r(seed);
  std::vector<uint32_t> to(hosts);
  std::iota(to.begin(), to.end(), 0);
  std::shuffle(to.begin(), to.end(), r);
  bool cross = hosts > hosts_per_tor;
  auto bad = [&](uint32_t h, uint32_t t) {
    return t == h || (cross && t / hosts_per_tor == h / hosts_per_tor);
  };
  for (uint32_t h = 0; h < hosts; h++) {
    for (int tries = 0; bad(h, to[h]) && tries < 100000; tries++) {
      uint32_t j = uint32_t(r() % hosts);
      if (!bad(h, to[j]) && !bad(j, to[h])) std::swap(to[h], to[j]);
    }
  }
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (uint32_t h = 0; h < hosts; h++)
    if (to[h] != h) out.emplace_back(h, to[h]);
  return out;
}

}  // namespace vstellar::ns3sim
