// Live migration at the engine level (Engine::save, Engine::restore,
// save_restore.cc): one side of a connected pair is saved as bytes in the
// middle of a busy exchange, its engine is thrown away, and a new engine at
// the same address (the guest's address moved with it to the new host)
// restores the bytes. Every work request then completes exactly once, the
// data arrives intact, no atomic runs twice, whichever side moved, with or
// without loss. A snapshot that does not fit (another engine shape, a
// number taken) is refused with nothing made; a damaged one (every
// truncation, thousands of corrupted bytes) is refused or restored into a
// QP that runs without a sanitizer report; a set that is not closed is not
// saved.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "engine_internal.h"
#include "sim_pair.h"

namespace vstellar::test {
namespace {

// The owner's description of a translator (Engine::SaveMem): the tests'
// MRs are all HostMemory over the test's own buffers, which the new host
// (this process) maps the same way.
bool SaveHost(MemoryTranslator&, std::vector<uint8_t>* out) {
  out->push_back('H');
  return true;
}
std::shared_ptr<MemoryTranslator> RestoreHost(const uint8_t* p, size_t n) {
  return n == 1 && p[0] == 'H' ? std::make_shared<HostMemory>() : nullptr;
}

EngineObjects ObjectsOf(const Side& s) {
  EngineObjects o;
  o.pds = {s.pd};
  o.cqs = {s.scq, s.rcq};
  o.mrs = {s.mr};
  o.qps = {s.qp};
  return o;
}

// ---------------------------------------------------------------------------
// A mix of work from one side (the requester) to the other, laid out so that
// nothing one side writes is read by anyone: WRITEs of [0, 512 KiB) to the
// peer's kWriteDst, SENDs of [512 KiB, 640 KiB) into the peer's receives at
// kRecvArea, READs of the peer's [0, 256 KiB) to kReadDst, and fetch-and-adds
// of 1 on the peer's counter with the original values at kFaddOut.
constexpr size_t kBuf = 4 << 20;
constexpr int kWrites = 8, kSends = 8, kReads = 8, kFadds = 32;
constexpr uint32_t kWriteLen = 64 << 10, kSendLen = 16 << 10, kReadLen = 32 << 10;
constexpr size_t kSendSrc = 512 << 10, kWriteDst = 1 << 20, kRecvArea = 2 << 20, kReadDst = 3 << 20;
constexpr size_t kCounter = 3584 << 10, kFaddOut = kCounter + 4096;
constexpr int kSendWrs = kWrites + kSends + kReads + kFadds;

enum : uint64_t { kWriteId = 100, kSendId = 200, kReadId = 300, kFaddId = 400, kRecvId = 500 };

PairOptions Options() {
  PairOptions o;
  o.buf_size = kBuf;
  o.cap.max_inline_data = 0;  // no inline buffer at all (its WQEs still move)
  return o;
}

int Post(Side& s, Side& peer, WrOpcode op, uint64_t wr_id, size_t loff, uint32_t len, size_t roff,
         uint64_t add = 0) {
  Sge sg{s.addr(loff), len, s.mr->lkey()};
  SendWr wr;
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.send_flags = SEND_SIGNALED;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.remote_addr = peer.addr(roff);
  wr.rkey = peer.mr->rkey();
  wr.compare_add = add;
  return s.eng->post_send(s.qp, wr);
}

// The peer posts the receives first, then the requester its mix, READs and
// atomics between the WRITEs and SENDs so that all kinds are in flight at
// once.
void StartWork(Pair& p, Side& x, Side& y, uint64_t seed) {
  fill_random(x.buf.data(), kWriteDst, seed);
  for (int j = 0; j < kSends; j++) ASSERT_EQ(p.post_recv(y, kRecvId + j, kRecvArea + size_t(j) * kSendLen, kSendLen), 0);
  for (int i = 0; i < kWrites; i++) {
    ASSERT_EQ(Post(x, y, WrOpcode::RDMA_WRITE, kWriteId + i, size_t(i) * kWriteLen, kWriteLen,
                   kWriteDst + size_t(i) * kWriteLen),
              0);
    ASSERT_EQ(Post(x, y, WrOpcode::SEND, kSendId + i, kSendSrc + size_t(i) * kSendLen, kSendLen, 0), 0);
    ASSERT_EQ(Post(x, y, WrOpcode::RDMA_READ, kReadId + i, kReadDst + size_t(i) * kReadLen, kReadLen,
                   size_t(i) * kReadLen),
              0);
    for (int m = 4 * i; m < 4 * i + 4; m++)
      ASSERT_EQ(Post(x, y, WrOpcode::ATOMIC_FETCH_AND_ADD, kFaddId + m, kFaddOut + 8 * size_t(m), 8, kCounter, 1), 0);
  }
}

// The completions of a side's CQs, polled once everything is done (those
// made before the move moved with the CQs).
struct Seen {
  std::vector<Wc> sends, recvs;
};

void Drain(Side& s, Seen& seen) {
  Wc wc[64];
  int k;
  while ((k = s.eng->poll_cq(s.scq, wc, 64)) > 0) seen.sends.insert(seen.sends.end(), wc, wc + k);
  while ((k = s.eng->poll_cq(s.rcq, wc, 64)) > 0) seen.recvs.insert(seen.recvs.end(), wc, wc + k);
}

// Everything x asked of y happened once, in order, with the right bytes.
void CheckWork(Side& x, Side& y, const Seen& xs, const Seen& ys) {
  std::vector<uint64_t> want;
  for (int i = 0; i < kWrites; i++) {
    want.insert(want.end(), {kWriteId + i, kSendId + i, kReadId + i});
    for (int m = 4 * i; m < 4 * i + 4; m++) want.push_back(kFaddId + m);
  }
  ASSERT_EQ(xs.sends.size(), want.size()) << "requester completions";
  for (size_t i = 0; i < want.size(); i++) {
    EXPECT_EQ(xs.sends[i].wr_id, want[i]) << "completion " << i << " out of order or twice";
    EXPECT_EQ(xs.sends[i].status, WcStatus::SUCCESS) << "wr " << xs.sends[i].wr_id;
  }
  ASSERT_EQ(ys.recvs.size(), size_t(kSends)) << "receive completions are exactly the SENDs";
  for (int j = 0; j < kSends; j++) {
    EXPECT_EQ(ys.recvs[j].wr_id, kRecvId + j);
    EXPECT_EQ(ys.recvs[j].status, WcStatus::SUCCESS);
    EXPECT_EQ(ys.recvs[j].byte_len, kSendLen);
  }
  EXPECT_EQ(std::memcmp(y.buf.data() + kWriteDst, x.buf.data(), kWrites * size_t(kWriteLen)), 0) << "WRITE data";
  EXPECT_EQ(std::memcmp(y.buf.data() + kRecvArea, x.buf.data() + kSendSrc, kSends * size_t(kSendLen)), 0)
      << "SEND data";
  EXPECT_EQ(std::memcmp(x.buf.data() + kReadDst, y.buf.data(), kReads * size_t(kReadLen)), 0) << "READ data";
  uint64_t counter;
  std::memcpy(&counter, y.buf.data() + kCounter, 8);
  EXPECT_EQ(counter, uint64_t(kFadds)) << "an atomic ran twice, or not at all";
  // Each fetch-and-add saw a value no other saw: 0 .. kFadds-1, once each.
  std::set<uint64_t> orig;
  for (int m = 0; m < kFadds; m++) {
    uint64_t v;
    std::memcpy(&v, x.buf.data() + kFaddOut + 8 * size_t(m), 8);
    orig.insert(v);
  }
  EXPECT_EQ(orig.size(), size_t(kFadds));
  EXPECT_EQ(orig.empty() ? 0 : *orig.rbegin(), uint64_t(kFadds - 1));
}

struct MigrateOptions {
  uint64_t downtime_ns = 300'000;  // the address answers nothing meanwhile
  bool notices = false;            // PAUSED before, RESUMED after (Engine::notify_peers)
};

// Side s moves to another host: its objects are saved, its engine is
// destroyed with whatever it had not sent yet, and a new engine at the same
// address restores them, with translators rebuilt by the owner.
void Migrate(Pair& p, Side& s, const MigrateOptions& mo = {}) {
  const EngineObjects objs = ObjectsOf(s);
  const uint32_t qpn = s.qp->qpn(), key = s.mr->lkey();
  const uint32_t unpolled = s.scq->count() + s.rcq->count();
  if (mo.notices) s.eng->notify_peers(objs, /*resumed=*/false);
  std::vector<uint8_t> state;
  ASSERT_EQ(s.eng->save(objs, SaveHost, &state), 0);
  EXPECT_EQ(s.eng->audit_log(), "");
  const EngineConfig cfg = s.eng->config();
  // The source host's engine goes, with whatever it had not sent; datagrams
  // to the address reach the new host from now on.
  s.eng = std::make_unique<Engine>(cfg, p.net.link_of(s.ip), p.net);
  p.net.attach(s.ip, s.eng.get());
  p.net.run_for(mo.downtime_ns);
  EngineObjects got;
  std::string err;
  ASSERT_EQ(s.eng->restore(state.data(), state.size(), RestoreHost, /*qp_owner=*/7, &got, &err), 0) << err;
  ASSERT_EQ(got.pds.size(), 1u);
  ASSERT_EQ(got.cqs.size(), 2u);
  ASSERT_EQ(got.mrs.size(), 1u);
  ASSERT_EQ(got.qps.size(), 1u);
  EXPECT_EQ(got.qps[0]->qpn(), qpn);
  EXPECT_EQ(got.mrs[0]->lkey(), key);
  EXPECT_EQ(got.cqs[0]->count() + got.cqs[1]->count(), unpolled) << "completions not yet polled";
  EXPECT_EQ(impl(*got.qps[0]).init.owner, 7u);
  s.pd = got.pds[0];
  s.scq = got.cqs[0];
  s.rcq = got.cqs[1];
  s.mr = got.mrs[0];
  s.qp = got.qps[0];
  if (mo.notices) s.eng->notify_peers(got, /*resumed=*/true);
}

bool AllDone(Side& x, Side& y, bool both_ways) {
  const uint32_t sends = kSendWrs, recvs = kSends;
  bool done = x.scq->count() >= sends && y.rcq->count() >= recvs;
  if (both_ways) done = done && y.scq->count() >= sends && x.rcq->count() >= recvs;
  return done;
}

// Work from a (and, both_ways, from b) starts; once `mover` has had a few
// of its own WRs complete (and with many packets, READs and atomics in
// flight), it migrates; everything then finishes exactly once.
void RunMigration(Pair& p, Side& mover, bool both_ways, const MigrateOptions& mo = {}) {
  // A 10 Gbit/s port in front of each host and 50 us each way: the work
  // takes about a millisecond, and windows are full when the side moves.
  p.net.impairment.delay_ns = 50'000;
  p.net.impairment.downlink.rate_bps = 10'000'000'000;
  StartWork(p, p.a, p.b, 11);
  if (both_ways) StartWork(p, p.b, p.a, 12);
  // Nothing is polled before the move: the CQs move with completions in them.
  Side& req = both_ways || &mover == &p.a ? mover : p.a;
  ASSERT_TRUE(p.net.run_until([&] { return req.scq->count() >= 8; }));
  const QpImpl& q = impl(*mover.qp);
  if (&req == &mover) {
    EXPECT_GT(q.snd_nxt - q.snd_una, 32u) << "packets in flight when it moves";
    EXPECT_GT(q.rd_atomic_outstanding, 0u) << "READs or atomics outstanding when it moves";
  } else {
    EXPECT_NE(q.epsn, q.attr.rq_psn) << "the responder has taken requests when it moves";
  }
  ASSERT_LT(req.scq->count(), uint32_t(kSendWrs));
  // What the source host sent in its last moments never arrives (it was in
  // its queues): requests the mover executed are answered again from its
  // restored state (READs done, the atomic replay cache), not executed again.
  p.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>&) { return from != mover.ip; };
  p.net.run_for(30'000);
  p.net.tap = nullptr;
  ASSERT_NO_FATAL_FAILURE(Migrate(p, mover, mo));
  ASSERT_TRUE(p.net.run_until([&] { return AllDone(p.a, p.b, both_ways); }, 20'000'000'000ull))
      << "a: " << p.a.scq->count() << "/" << p.a.rcq->count() << " b: " << p.b.scq->count() << "/"
      << p.b.rcq->count();
  // Nothing more comes, however long the network runs.
  p.net.run_for(100'000'000);
  Seen sa, sb;
  Drain(p.a, sa);
  Drain(p.b, sb);
  CheckWork(p.a, p.b, sa, sb);
  if (both_ways) {
    CheckWork(p.b, p.a, sb, sa);
  } else {
    EXPECT_TRUE(sb.sends.empty() && sa.recvs.empty());
  }
  // The moved responder answered resends of requests it had executed
  // before it moved (its answers were lost with the old host).
  if (!both_ways && &mover == &p.b) {
    EXPECT_GT(mover.eng->stats().dup_pkts, 0u);
  }
}

// 1. The requester (both sides are, here) moves in the middle.
TEST(EngineSnapshot, BothWaysBusyPairFinishesExactlyOnceAfterOneSideMoves) {
  Pair p(Options());
  RunMigration(p, p.a, /*both_ways=*/true);
}

// 2. The same with loss: the resends from the new host and the
// peer's answers to duplicates are all that recovers the lost packets.
TEST(EngineSnapshot, MovesUnderLoss) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    PairOptions o = Options();
    o.seed = seed;
    Pair p(o);
    p.net.impairment.loss = 0.01;
    RunMigration(p, p.a, /*both_ways=*/true);
  }
}

// 3. Only the responder moves: its arrival bitmap, held requests, READs
// done and atomic replay cache answer the requester's resends.
TEST(EngineSnapshot, TheResponderMoves) {
  Pair p(Options());
  RunMigration(p, p.b, /*both_ways=*/false);
}

TEST(EngineSnapshot, TheResponderMovesUnderLoss) {
  Pair p(Options());
  p.net.impairment.loss = 0.01;
  RunMigration(p, p.b, /*both_ways=*/false);
}

// A stop longer than the peer's retry limit (8 x 67 ms here): the PAUSED
// notice holds the peer's retry clock, RESUMED from the new host restarts it.
TEST(EngineSnapshot, ALongStopWithPeerNotices) {
  Pair p(Options());
  MigrateOptions mo;
  mo.downtime_ns = 2'000'000'000;
  mo.notices = true;
  RunMigration(p, p.a, /*both_ways=*/true, mo);
}

// ---------------------------------------------------------------------------
// What restore() refuses, and that it then makes nothing.

// A connected, idle pair; a's objects saved.
struct Saved {
  explicit Saved(const PairOptions& o = {}) : p(o) {
    qpn = p.a.qp->qpn();
    key = p.a.mr->lkey();
    EXPECT_EQ(p.a.eng->save(ObjectsOf(p.a), SaveHost, &state), 0);
  }
  // An engine at an address of its own (it sends nothing here).
  std::unique_ptr<Engine> Dest(const EngineConfig& c, uint32_t ip) {
    return std::make_unique<Engine>(c, p.net.add_node(ip), p.net);
  }
  int Restore(Engine& e, EngineObjects* out, std::string* err) {
    return e.restore(state.data(), state.size(), RestoreHost, 0, out, err);
  }
  // Nothing of the state is in e (its own objects aside).
  void ExpectNothingOf(Engine& e, size_t own_qps = 0, Mr* own_mr = nullptr) {
    EXPECT_EQ(e.find_mr(key), own_mr);
    EXPECT_EQ(e.describe_qps().size(), own_qps);
    EXPECT_EQ(e.active_qps(), 0u);
  }
  Pair p;
  std::vector<uint8_t> state;
  uint32_t qpn = 0, key = 0;
};

// 4a. The QP's window ring, path tables, packet sizes and MACs are sized
// by the engine: another shape takes nothing.
TEST(EngineSnapshot, AnEngineOfAnotherShapeIsRefused) {
  Saved s;
  const EngineConfig base = s.p.a.eng->config();
  std::vector<std::pair<const char*, EngineConfig>> shapes;
  EngineConfig c = base;
  c.window_pkts = 1024;
  shapes.push_back({"window", c});
  c = base;
  c.num_paths = 64;
  shapes.push_back({"paths", c});
  c = base;
  c.mtu = 2048;
  shapes.push_back({"MTU", c});
  c = base;
  c.integrity = true;
  c.integrity_key.fill(7);
  shapes.push_back({"integrity", c});
  uint32_t ip = 0x0a000010;
  for (auto& [what, cfg] : shapes) {
    SCOPED_TRACE(what);
    auto e = s.Dest(cfg, ip++);
    EngineObjects out;
    out.pds = {nullptr};  // untouched on failure
    std::string err;
    EXPECT_EQ(s.Restore(*e, &out, &err), EINVAL);
    EXPECT_NE(err, "");
    EXPECT_EQ(out.pds.size(), 1u);
    s.ExpectNothingOf(*e);
  }
  auto same = s.Dest(base, ip);
  EngineObjects out;
  std::string err;
  EXPECT_EQ(s.Restore(*same, &out, &err), 0) << err;
  EXPECT_EQ(same->find_qp(s.qpn), out.qps.at(0));
}

// 4a'. The objects are made within the memory the caller has left: their
// footprints (as create_qp, create_cq and create_srq count them) are
// counted before each is made, so a state cannot ask for more; one byte
// short is ENOMEM with nothing made, the exact sum fits.
TEST(EngineSnapshot, ObjectsAreMadeWithinTheMemoryLeft) {
  Saved s;
  const EngineConfig base = s.p.a.eng->config();
  size_t need = 0;
  {
    auto e = s.Dest(base, 0x0a000020);
    EngineObjects out;
    std::string err;
    ASSERT_EQ(s.Restore(*e, &out, &err), 0) << err;
    for (Cq* c : out.cqs) need += e->footprint(c);
    for (Qp* q : out.qps) need += e->footprint(q);
    need += out.mrs.size() * sizeof(Mr) + out.mws.size() * sizeof(Mw);
    for (Srq* q : out.srqs) need += e->footprint(q);
    EXPECT_GE(need, e->footprint(out.qps.at(0)));
  }
  auto e = s.Dest(base, 0x0a000021);
  EngineObjects out;
  std::string err;
  EXPECT_EQ(e->restore(s.state.data(), s.state.size(), RestoreHost, 0, &out, &err, need - 1), ENOMEM);
  EXPECT_NE(err.find("memory"), std::string::npos) << err;
  s.ExpectNothingOf(*e);
  EXPECT_EQ(e->restore(s.state.data(), s.state.size(), RestoreHost, 0, &out, &err, need), 0) << err;
  EXPECT_EQ(e->find_qp(s.qpn), out.qps.at(0));
}

// 4b. A QPN or a key the engine already has: EEXIST, and nothing made
// (restoring again once the number is free works).
TEST(EngineSnapshot, ANumberInUseIsRefused) {
  PairOptions o;
  o.cfg.key_seed = 99;  // keys repeat too: an engine of the same seeds draws a's numbers first
  Saved s(o);
  const EngineConfig base = s.p.a.eng->config();
  {
    auto e = s.Dest(base, 0x0a000010);  // the same QPN seed: its first QP gets a's QPN
    Pd* pd = e->alloc_pd();
    Cq* cq = e->create_cq(16);
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    Qp* q = e->create_qp(pd, ia);
    ASSERT_EQ(q->qpn(), s.qpn);
    EngineObjects out;
    std::string err;
    EXPECT_EQ(s.Restore(*e, &out, &err), EEXIST);
    EXPECT_NE(err.find("QPN"), std::string::npos) << err;
    EXPECT_TRUE(out.qps.empty());
    s.ExpectNothingOf(*e, 1);
    ASSERT_EQ(e->destroy_qp(q), 0);
    EXPECT_EQ(s.Restore(*e, &out, &err), 0) << err;  // a QPN in quarantine may come back: it is the same QP
  }
  {
    EngineConfig c = base;
    c.qpn_seed = 12345;
    auto e = s.Dest(c, 0x0a000011);
    Pd* pd = e->alloc_pd();
    Mr* mr = e->reg_mr(pd, 0x10000, 4096, ACCESS_LOCAL_WRITE, std::make_shared<HostMemory>());
    ASSERT_EQ(mr->lkey() >> 8, s.key >> 8);
    EngineObjects out;
    std::string err;
    EXPECT_EQ(s.Restore(*e, &out, &err), EEXIST);
    EXPECT_NE(err.find("key"), std::string::npos) << err;
    s.ExpectNothingOf(*e, 0, mr);
    ASSERT_EQ(e->dereg_mr(mr), 0);
    EXPECT_EQ(s.Restore(*e, &out, &err), 0) << err;
  }
}

// The restored numbers are the engine's now: it never hands them out to a
// new object while they live, nor right after they die (quarantine).
TEST(EngineSnapshot, RestoredNumbersAreNotHandedOutAgain) {
  PairOptions o;
  o.cfg.key_seed = 99;
  Saved s(o);
  // The same seeds: left alone, this engine would draw a's numbers first.
  auto e = s.Dest(s.p.a.eng->config(), 0x0a000010);
  EngineObjects got;
  std::string err;
  ASSERT_EQ(s.Restore(*e, &got, &err), 0) << err;
  Pd* pd = e->alloc_pd();
  Cq* cq = e->create_cq(16);
  std::set<uint32_t> cqns;
  for (Cq* c : got.cqs) cqns.insert(c->cqn());
  EXPECT_FALSE(cqns.count(cq->cqn()));
  EXPECT_NE(pd->handle(), got.pds[0]->handle());
  auto make = [&] {
    QpInitAttr ia;
    ia.send_cq = ia.recv_cq = cq;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 1;
    Qp* q = e->create_qp(pd, ia);
    Mr* m = e->reg_mr(pd, 0x10000, 4096, ACCESS_LOCAL_WRITE, std::make_shared<HostMemory>());
    EXPECT_TRUE(q && m);
    EXPECT_NE(q->qpn(), s.qpn);
    EXPECT_NE(m->lkey() >> 8, s.key >> 8);
  };
  for (int i = 0; i < 50; i++) make();
  ASSERT_EQ(e->destroy_qp(got.qps[0]), 0);
  ASSERT_EQ(e->dereg_mr(got.mrs[0]), 0);
  for (int i = 0; i < 50; i++) make();
  EXPECT_TRUE(e->take_returned_ids().empty()) << "numbers of its own shard stay here";
}

// Times travel as ages and waits: an engine whose clock reads something
// else entirely sees the same ages, and its timers fall within one RTO.
TEST(EngineSnapshot, TimesAreRelativeToTheDestinationClock) {
  struct FixedClock final : Clock {
    uint64_t t;
    uint64_t now_ns() override { return t; }
  };
  Pair p(Options());
  p.net.impairment.delay_ns = 50'000;
  StartWork(p, p.a, p.b, 5);
  StartWork(p, p.b, p.a, 6);  // a acknowledges too
  ASSERT_TRUE(p.net.run_until([&] { return p.a.scq->count() >= 4; }));
  const QpImpl& src = impl(*p.a.qp);
  ASSERT_NE(src.snd_una, src.snd_nxt);
  std::vector<uint8_t> state;
  ASSERT_EQ(p.a.eng->save(ObjectsOf(p.a), SaveHost, &state), 0);
  const uint64_t src_now = p.net.now_ns();
  for (uint64_t dest_now : {uint64_t(3'000'000'000'000), src_now + 1}) {
    FixedClock clock;
    clock.t = dest_now;
    Engine e(p.a.eng->config(), p.net.add_node(0x0a000010), clock);
    EngineObjects got;
    std::string err;
    ASSERT_EQ(e.restore(state.data(), state.size(), RestoreHost, 0, &got, &err), 0) << err;
    const QpImpl& dst = impl(*got.qps[0]);
    ASSERT_EQ(dst.snd_una, src.snd_una);
    ASSERT_EQ(dst.snd_nxt, src.snd_nxt);
    for (uint32_t psn = src.snd_una; psn != src.snd_nxt; psn++) {
      const PktRec& a = const_cast<QpImpl&>(src).rec(psn);
      const PktRec& b = const_cast<QpImpl&>(dst).rec(psn);
      EXPECT_EQ(dest_now - b.sent_ns, src_now - a.sent_ns) << psn;
    }
    ASSERT_NE(src.last_ack_ns, 0u);
    EXPECT_EQ(dest_now - dst.last_ack_ns, src_now - src.last_ack_ns);
    const uint64_t d = e.next_deadline();
    EXPECT_GE(d, dest_now);
    EXPECT_LE(d, dest_now + p.a.eng->config().rto_max_ns);
  }
}

// Packets found lost and waiting for room in the window (QpImpl::resend)
// move as they are: queued for their resend, out of the bytes in flight,
// and without a timer of their own (the resend arms one).
TEST(EngineSnapshot, LostPacketsWaitingForTheirResendMove) {
  // A small initial window: the restored QP starts with it (the paths are
  // new) and more in flight than it allows, so the resends wait.
  PairOptions o = Options();
  o.cfg.cc.init_cwnd = 64 << 10;
  Pair p(o);
  p.net.impairment.delay_ns = 50'000;
  StartWork(p, p.a, p.b, 5);
  QpImpl& q = impl(*p.a.qp);
  ASSERT_TRUE(p.net.run_until([&] { return q.inflight > 2 * o.cfg.cc.init_cwnd; }));
  // Take the newest unanswered packets as lost, as the completer does
  // (EngineCore::lose_for_resend) when an answer shows them missing.
  int lost = 0;
  for (uint32_t psn = q.snd_nxt - 1; lost < 4 && psn != q.snd_una; psn--) {
    PktRec& r = q.rec(psn);
    if (r.acked || r.lost || r.kind != PktKind::DATA) continue;
    q.path_unlink(psn);
    r.lost = true;
    r.tx_seq++;
    q.inflight -= r.len;
    q.resend.push_back(psn);
    lost++;
  }
  ASSERT_EQ(lost, 4);
  // And one answered before its resend went (req_resend skips it).
  q.resend.push_back(q.snd_una - 1);
  ASSERT_EQ(p.a.eng->audit(false), "");
  ASSERT_NO_FATAL_FAILURE(Migrate(p, p.a));
  ASSERT_EQ(p.a.eng->audit(false), "") << "the restored QP's books";
  ASSERT_TRUE(p.net.run_until([&] { return AllDone(p.a, p.b, false); }));
  Seen sa, sb;
  Drain(p.a, sa);
  Drain(p.b, sb);
  CheckWork(p.a, p.b, sa, sb);
}

// States the engine reaches in ordinary use round-trip, at the edges of
// what restore() checks: a QP before RTR on an engine whose MTU is below
// the QP's initial segment size; READs executed for a peer with a larger
// MTU (their segment size is the peer's); a QP on an SRQ created with a
// receive SGE count that the SRQ makes irrelevant.
TEST(EngineSnapshot, StatesAtTheEdgesRoundTrip) {
  PairOptions o = Options();
  o.cfg.mtu = 1024;
  EngineConfig big;
  big.mtu = 8192;
  o.cfg_b = big;
  Pair p(o);
  // b READs from a with 8 KiB segments: a keeps those READs for re-requests.
  fill_random(p.a.buf.data(), 65536, 3);
  ASSERT_EQ(Post(p.b, p.a, WrOpcode::RDMA_READ, 1, 0, 65536, 0), 0);
  ASSERT_EQ(p.wait(p.b, p.b.scq, 1).size(), 1u);
  ASSERT_FALSE(impl(*p.a.qp).reads_done.empty());
  EXPECT_GT(impl(*p.a.qp).reads_done.back().seg, p.a.eng->config().mtu);
  EngineObjects objs = ObjectsOf(p.a);
  // A QP in INIT (segment size 4096 until RTR) on an SRQ.
  SrqInitAttr si;
  si.max_wr = 8;
  Srq* srq = p.a.eng->create_srq(p.a.pd, si);
  QpInitAttr ia;
  ia.send_cq = ia.recv_cq = p.a.scq;
  ia.srq = srq;
  ia.cap.max_recv_sge = 64;  // ignored with an SRQ
  Qp* init_qp = p.a.eng->create_qp(p.a.pd, ia);
  ASSERT_NE(init_qp, nullptr);
  QpAttr at;
  at.qp_state = QpState::INIT;
  at.port_num = 1;
  ASSERT_EQ(p.a.eng->modify_qp(init_qp, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS), 0);
  objs.srqs = {srq};
  objs.qps.push_back(init_qp);
  std::vector<uint8_t> state;
  ASSERT_EQ(p.a.eng->save(objs, SaveHost, &state), 0);
  Engine e(p.a.eng->config(), p.net.add_node(0x0a000010), p.net);
  EngineObjects got;
  std::string err;
  EXPECT_EQ(e.restore(state.data(), state.size(), RestoreHost, 0, &got, &err), 0) << err;
}

// A QP that failed in the middle of a transfer (a WRITE to a bad rkey)
// moves too: in ERR, with packets of flushed WQEs still in its window.
TEST(EngineSnapshot, AQpInErrorMoves) {
  Pair p(Options());
  p.net.impairment.delay_ns = 50'000;
  for (int i = 0; i < 8; i++) {
    Sge sg{p.a.addr(size_t(i) << 16), 65536, p.a.mr->lkey()};
    SendWr wr;
    wr.wr_id = i;
    wr.opcode = WrOpcode::RDMA_WRITE;
    wr.send_flags = SEND_SIGNALED;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.remote_addr = p.b.addr(size_t(i) << 16);
    wr.rkey = i == 2 ? p.b.mr->rkey() ^ 0x100 : p.b.mr->rkey();  // the third names no MR
    ASSERT_EQ(p.a.eng->post_send(p.a.qp, wr), 0);
  }
  ASSERT_TRUE(p.net.run_until([&] { return p.a.qp->state() == QpState::ERR; }));
  const QpImpl& q = impl(*p.a.qp);
  ASSERT_NE(q.snd_una, q.snd_nxt) << "packets of flushed WQEs in the window";
  const uint32_t flushed = p.a.scq->count();
  ASSERT_NO_FATAL_FAILURE(Migrate(p, p.a));
  EXPECT_EQ(p.a.qp->state(), QpState::ERR);
  EXPECT_EQ(p.a.scq->count(), flushed);
  // It can be reset and used again, as any QP in ERR.
  QpAttr at;
  at.qp_state = QpState::RESET;
  EXPECT_EQ(p.a.eng->modify_qp(p.a.qp, at, QP_STATE), 0);
}

// ---------------------------------------------------------------------------
// 6. save() takes a closed set of this engine's objects only, and changes
// nothing when it refuses.
TEST(EngineSnapshot, OpenSetsAreNotSaved) {
  Pair p(Options());
  const std::vector<uint8_t> untouched = {1, 2, 3};
  auto refused = [&](const EngineObjects& o) {
    std::vector<uint8_t> out = untouched;
    const int e = p.a.eng->save(o, SaveHost, &out);
    EXPECT_EQ(out, untouched);
    return e;
  };
  EngineObjects o = ObjectsOf(p.a);
  o.cqs = {p.a.scq};  // the QP's receive CQ stays behind
  EXPECT_EQ(refused(o), EINVAL);
  o = ObjectsOf(p.a);
  o.mrs.clear();  // an MR of the saved PD stays behind
  EXPECT_EQ(refused(o), EINVAL);
  o = ObjectsOf(p.a);
  o.pds.clear();  // the MR's and the QP's PD stays behind
  EXPECT_EQ(refused(o), EINVAL);
  o = ObjectsOf(p.a);
  o.qps.push_back(p.b.qp);  // another engine's
  EXPECT_EQ(refused(o), EINVAL);
  o = ObjectsOf(p.a);
  o.mrs.push_back(nullptr);
  EXPECT_EQ(refused(o), EINVAL);
  // A multicast member: its membership is the old host's link's.
  Pd* pd = p.a.eng->alloc_pd();
  Cq* cq = p.a.eng->create_cq(16);
  QpInitAttr ia;
  ia.qp_type = QpType::UD;
  ia.send_cq = ia.recv_cq = cq;
  Qp* ud = p.a.eng->create_qp(pd, ia);
  Gid group{};
  group[10] = group[11] = 0xff;
  group[12] = 230;
  group[15] = 1;
  ASSERT_EQ(p.a.eng->attach_mcast(ud, group), 0);
  EngineObjects m;
  m.pds = {pd};
  m.cqs = {cq};
  m.qps = {ud};
  EXPECT_EQ(refused(m), EBUSY);
  ASSERT_EQ(p.a.eng->detach_mcast(ud, group), 0);
  std::vector<uint8_t> out;
  EXPECT_EQ(p.a.eng->save(m, SaveHost, &out), 0);
  // The set saved is still there, unchanged, and runs on.
  EXPECT_EQ(p.a.eng->find_qp(ud->qpn()), ud);
  EXPECT_EQ(p.a.eng->find_qp(p.a.qp->qpn()), p.a.qp);
}

// ---------------------------------------------------------------------------
// 5. Damaged snapshots: the bytes come from another host through QEMU's
// migration stream.

// One test buffer's memory and nothing else, as a device's translator maps
// its guest's memory only: a restored MR whose range a damaged snapshot
// moved still reaches no other byte of this process.
class BufferMemory final : public MemoryTranslator {
 public:
  explicit BufferMemory(std::vector<uint8_t>& b) : base_(b.data()), size_(b.size()) {}
  TranslateResult translate(uint64_t iova, uint64_t len, bool, HostSpan* out, size_t max_out) override {
    TranslateResult r;
    const uint64_t off = iova - uint64_t(uintptr_t(base_));
    if (max_out == 0 || iova < uint64_t(uintptr_t(base_)) || off > size_ || len > size_ - off) return r;
    out[0] = {base_ + off, size_t(len)};
    r.count = 1;
    r.covered = len;
    r.ok = true;
    return r;
  }

 private:
  uint8_t* base_;
  size_t size_;
};

// A pair with a bit of everything a snapshot holds, saved at one moment:
// on a, WRITEs, inline SENDs, READs and atomics in flight, b's requests
// executed with their answers lost, receives posted and completions not
// polled, an SRQ with WQEs and a second QP on it, a fast-registration MR,
// and windows of both types, one bound; b is a's peer. Small shapes keep
// the snapshot short (every prefix of it is tried).
struct Rich {
  static PairOptions Shape() {
    PairOptions o;
    o.connect = false;  // small CQs first (Pair's are large: restoring them thousands of times would cost)
    o.cfg.window_pkts = 256;
    o.cfg.num_paths = 16;
    o.cfg.key_seed = 5;
    o.cap.max_send_wr = 32;
    o.cap.max_recv_wr = 16;
    o.cap.max_inline_data = 64;
    o.buf_size = 256 << 10;
    return o;
  }
  Rich() : p(Shape()) {
    Side& a = p.a;
    Side& b = p.b;
    for (Side* s : {&a, &b}) {
      EXPECT_EQ(s->eng->destroy_qp(s->qp), 0);
      EXPECT_EQ(s->eng->destroy_cq(s->scq), 0);
      EXPECT_EQ(s->eng->destroy_cq(s->rcq), 0);
      s->scq = s->eng->create_cq(256);
      s->rcq = s->eng->create_cq(256);
      QpInitAttr ia;
      ia.send_cq = s->scq;
      ia.recv_cq = s->rcq;
      ia.cap = p.opt.cap;
      s->qp = s->eng->create_qp(s->pd, ia);
    }
    p.connect();
    // A UC pair and a UD QP besides.
    uc_a = Connected(a, QpType::UC, 0);
    uc_b = Connected(b, QpType::UC, 0);
    ConnectUc(a, uc_a, b, uc_b);
    ConnectUc(b, uc_b, a, uc_a);
    ud = Connected(a, QpType::UD, 0x1234);
    p.net.impairment.delay_ns = 50'000;
    p.net.impairment.downlink.rate_bps = 1'000'000'000;
    mr2 = a.eng->reg_mr(a.pd, a.addr(128 << 10), 64 << 10, ACCESS_LOCAL_WRITE | ACCESS_REMOTE_READ | ACCESS_MW_BIND,
                        std::make_shared<HostMemory>());
    fast = a.eng->alloc_mr(a.pd, 16);
    mw1 = a.eng->alloc_mw(a.pd, 1);
    mw2 = a.eng->alloc_mw(a.pd, 2);
    SrqInitAttr si;
    si.max_wr = 16;
    si.limit = 2;
    srq = a.eng->create_srq(a.pd, si);
    QpInitAttr ia;
    ia.send_cq = a.scq;
    ia.recv_cq = a.rcq;
    ia.srq = srq;
    qp2 = a.eng->create_qp(a.pd, ia);
    EXPECT_TRUE(mr2 && fast && mw1 && mw2 && srq && qp2);
    for (int i = 0; i < 4; i++) {
      Sge sg{a.addr(200 << 10) + 1024u * i, 1024, a.mr->lkey()};
      RecvWr rw;
      rw.wr_id = 900 + i;
      rw.sg_list = &sg;
      rw.num_sge = 1;
      EXPECT_EQ(a.eng->post_srq_recv(srq, rw), 0);
    }
    SendWr bind;
    bind.wr_id = 1;
    bind.opcode = WrOpcode::BIND_MW;
    bind.send_flags = SEND_SIGNALED;
    bind.bind = {mw2->rkey(), (mw2->rkey() & ~0xFFu) | ((mw2->rkey() + 1) & 0xFF), mr2->lkey(), a.addr(128 << 10),
                 4096, ACCESS_REMOTE_READ, 2};
    EXPECT_EQ(a.eng->post_send(a.qp, bind), 0);
    fill_random(a.buf.data(), 64 << 10, 1);
    fill_random(b.buf.data(), 64 << 10, 2);
    for (int i = 0; i < 4; i++) {
      EXPECT_EQ(p.post_recv(b, 10 + i, (64 << 10) + 4096u * i, 4096), 0);
      EXPECT_EQ(p.post_recv(a, 20 + i, (64 << 10) + 8192u * i, 8192), 0);
    }
    for (int i = 0; i < 4; i++) {
      EXPECT_EQ(Post(a, b, WrOpcode::RDMA_WRITE, 30 + i, 16384u * i, 16384, (96 << 10) + 16384u * i), 0);
      Sge sg{a.addr(1000 + 64u * i), 48, a.mr->lkey()};
      SendWr in;
      in.wr_id = 40 + i;
      in.opcode = WrOpcode::SEND;
      in.send_flags = SEND_SIGNALED | SEND_INLINE;
      in.sg_list = &sg;
      in.num_sge = 1;
      EXPECT_EQ(a.eng->post_send(a.qp, in), 0);
      EXPECT_EQ(Post(a, b, WrOpcode::RDMA_READ, 50 + i, (160 << 10) + 16384u * i, 16384, 16384u * i), 0);
      EXPECT_EQ(Post(a, b, WrOpcode::ATOMIC_FETCH_AND_ADD, 60 + i, (230 << 10) + 8u * i, 8, 250 << 10, 1), 0);
      EXPECT_EQ(Post(b, a, WrOpcode::SEND, 70 + i, 16384u * i, 8192, 0), 0);
      EXPECT_EQ(Post(b, a, WrOpcode::ATOMIC_FETCH_AND_ADD, 80 + i, (230 << 10) + 8u * i, 8, 250 << 10, 1), 0);
      EXPECT_EQ(Post(b, a, WrOpcode::RDMA_READ, 90 + i, (160 << 10) + 16384u * i, 16384, 16384u * i), 0);
    }
    for (int i = 0; i < 2; i++) {
      EXPECT_EQ(p.post_recv(b, 100 + i, (32 << 10) + 4096u * i, 4096), 0);  // b's RC receives: more of them
      Sge sg{a.addr(4096u * i), 4096, a.mr->lkey()};
      SendWr wr;
      wr.wr_id = 110 + i;
      wr.opcode = WrOpcode::RDMA_WRITE;
      wr.send_flags = SEND_SIGNALED;
      wr.sg_list = &sg;
      wr.num_sge = 1;
      wr.remote_addr = b.addr((200 << 10) + 4096u * i);
      wr.rkey = b.mr->rkey();
      EXPECT_EQ(a.eng->post_send(uc_a, wr), 0);
      wr.wr_id = 120 + i;
      wr.opcode = WrOpcode::SEND;
      wr.ud.peer = Endpoint{kIpB, 4791};
      wr.ud.remote_qpn = 0xdead;  // nobody: dropped there
      wr.ud.remote_qkey = 0x1234;
      EXPECT_EQ(a.eng->post_send(ud, wr), 0);
    }
    EXPECT_TRUE(p.net.run_until([&] { return a.scq->count() >= 3; }));
    p.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>&) { return from != kIpA; };
    p.net.run_for(30'000);
    p.net.tap = nullptr;
    const QpImpl& q = impl(*a.qp);
    EXPECT_NE(q.snd_una, q.snd_nxt);
    EXPECT_NE(q.sq_head, q.sq_tail);
    for (auto* m : {&a.mr->mem(), &mr2->mem()}) mem_of[m] = 'A';
    mem_of[&b.mr->mem()] = 'B';
    EXPECT_EQ(a.eng->save(ObjectsOfA(), SaveMem(), &a_state), 0);
    EXPECT_EQ(b.eng->save(ObjectsOfB(), SaveMem(), &b_state), 0);
  }
  EngineObjects ObjectsOfA() {
    EngineObjects o = ObjectsOf(p.a);
    o.srqs = {srq};
    o.mrs = {p.a.mr, mr2, fast};
    o.mws = {mw1, mw2};
    o.qps = {p.a.qp, qp2, uc_a, ud};
    return o;
  }
  EngineObjects ObjectsOfB() {
    EngineObjects o = ObjectsOf(p.b);
    o.qps.push_back(uc_b);
    return o;
  }
  // A QP of side s's PD and CQs, in RTS if UD, in INIT otherwise.
  Qp* Connected(Side& s, QpType t, uint32_t qkey) {
    QpInitAttr ia;
    ia.qp_type = t;
    ia.send_cq = s.scq;
    ia.recv_cq = s.rcq;
    ia.cap = p.opt.cap;
    Qp* q = s.eng->create_qp(s.pd, ia);
    QpAttr at;
    at.qp_state = QpState::INIT;
    at.port_num = 1;
    at.qkey = qkey;
    at.qp_access_flags = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE;
    const uint32_t mask = t == QpType::UD ? QP_QKEY : QP_ACCESS_FLAGS;
    EXPECT_EQ(s.eng->modify_qp(q, at, QP_STATE | QP_PKEY_INDEX | QP_PORT | mask), 0);
    if (t == QpType::UD) {
      at.qp_state = QpState::RTR;
      EXPECT_EQ(s.eng->modify_qp(q, at, QP_STATE), 0);
      at.qp_state = QpState::RTS;
      EXPECT_EQ(s.eng->modify_qp(q, at, QP_STATE | QP_SQ_PSN), 0);
    }
    return q;
  }
  static void ConnectUc(Side& s, Qp* q, Side& peer, Qp* peer_qp) {
    QpAttr at;
    at.qp_state = QpState::RTR;
    at.path_mtu = MTU_4096;
    at.dest_qp_num = peer_qp->qpn();
    at.rq_psn = 77;
    at.ah = Endpoint{peer.ip, 4791};
    EXPECT_EQ(s.eng->modify_qp(q, at, QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN), 0);
    at.qp_state = QpState::RTS;
    at.sq_psn = 77;
    EXPECT_EQ(s.eng->modify_qp(q, at, QP_STATE | QP_SQ_PSN), 0);
  }
  Engine::SaveMem SaveMem() {
    return [this](MemoryTranslator& m, std::vector<uint8_t>* out) {
      out->push_back(mem_of.at(&m));
      return true;
    };
  }
  Engine::RestoreMem RestoreMem() {
    return [this](const uint8_t* d, size_t n) -> std::shared_ptr<MemoryTranslator> {
      if (n != 1 || (d[0] != 'A' && d[0] != 'B')) return nullptr;
      return std::make_shared<BufferMemory>(d[0] == 'A' ? p.a.buf : p.b.buf);
    };
  }

  // a's state (damaged or not) and b's into two new engines of a network
  // of their own; if a's is taken, the pair runs for a while and *audit
  // gets what a's engine found of its liveness rules. Returns what
  // restore() said of a's state, and *err why.
  int Run(const std::vector<uint8_t>& a_bytes, uint64_t run_ns, std::string* err, std::string* audit) {
    SimNet net(7);
    net.impairment.delay_ns = 20'000;
    Engine ea(p.a.eng->config(), net.add_node(kIpA), net);
    Engine eb(p.b.eng->config(), net.add_node(kIpB), net);
    net.attach(kIpA, &ea);
    net.attach(kIpB, &eb);
    EngineObjects got;
    EXPECT_EQ(eb.restore(b_state.data(), b_state.size(), RestoreMem(), 0, &got, err), 0) << *err;
    const int rc = ea.restore(a_bytes.data(), a_bytes.size(), RestoreMem(), 0, &got, err);
    if (rc != 0) {
      EXPECT_NE(*err, "");
      EXPECT_TRUE(ea.describe_qps().empty()) << "made a QP and failed";
      EXPECT_EQ(ea.find_mr(p.a.mr->lkey()), nullptr) << "made an MR and failed";
      EXPECT_EQ(ea.active_qps(), 0u);
      return rc;
    }
    net.run_for(run_ns);
    *audit = ea.audit_log();
    EXPECT_EQ(eb.audit_log(), "") << "the peer of a damaged QP broke its own rules";
    return rc;
  }

  Pair p;
  Mr* mr2 = nullptr;
  Mr* fast = nullptr;
  Mw* mw1 = nullptr;
  Mw* mw2 = nullptr;
  Srq* srq = nullptr;
  Qp* qp2 = nullptr;
  Qp* uc_a = nullptr;
  Qp* uc_b = nullptr;
  Qp* ud = nullptr;
  std::map<const MemoryTranslator*, uint8_t> mem_of;
  std::vector<uint8_t> a_state, b_state;
};

long MaxRssKb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(EngineSnapshot, TheRichStateMovesWhole) {
  Rich r;
  std::string err, audit;
  ASSERT_EQ(r.Run(r.a_state, 50'000'000, &err, &audit), 0) << err;
  EXPECT_EQ(audit, "");
}

// Every truncation is refused (the state ends with its event list, and
// restore() wants every byte), with nothing made.
TEST(EngineSnapshot, EveryTruncationIsRefused) {
  Rich r;
  const long rss = MaxRssKb();
  Engine e(r.p.a.eng->config(), r.p.net.add_node(0x0a000010), r.p.net);
  for (size_t n = 0; n < r.a_state.size(); n++) {
    EngineObjects got;
    std::string err;
    ASSERT_EQ(e.restore(r.a_state.data(), n, r.RestoreMem(), 0, &got, &err), EPROTO) << n;
    ASSERT_TRUE(e.describe_qps().empty()) << n;
  }
  EXPECT_LT(MaxRssKb() - rss, 512 << 10) << "KiB more at the peak";
}

// Single bytes changed at random: refused with nothing made, or restored
// into QPs that run against their intact peer without a sanitizer report
// and keep the engine's liveness rules (every WR still ends).
TEST(EngineSnapshot, CorruptedBytesAreRefusedOrRunHarmlessly) {
  Rich r;
  const long rss = MaxRssKb();
  std::mt19937_64 rng(42);
  std::map<int, int> results;
  for (int i = 0; i < 3000; i++) {
    std::vector<uint8_t> bad = r.a_state;
    const size_t at = rng() % bad.size();
    bad[at] ^= uint8_t(1 + rng() % 255);
    std::string err, audit;
    const int rc = r.Run(bad, 2'000'000, &err, &audit);
    ASSERT_TRUE(rc == 0 || rc == EPROTO || rc == EINVAL) << rc << " for byte " << at;
    ASSERT_EQ(audit, "") << "byte " << at;
    results[rc]++;
  }
  // Both happen: many bytes are data (wr_ids, addresses, times), many are
  // checked (counts, indices, enums, positions, the header's shape).
  EXPECT_GT(results[0], 1000);
  EXPECT_GT(results[EPROTO], 100);
  EXPECT_GT(results[EINVAL], 0);
  EXPECT_LT(MaxRssKb() - rss, 512 << 10) << "KiB more at the peak";
}

}  // namespace
}  // namespace vstellar::test
