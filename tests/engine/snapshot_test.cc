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

PairOptions Options(double loss = 0) {
  PairOptions o;
  o.buf_size = kBuf;
  (void)loss;
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

// The completions each CQ of a side produced, over its whole life (the
// CQs before and after the move).
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
  if (mo.notices) s.eng->notify_peers(objs, /*resumed=*/false);
  std::vector<uint8_t> state;
  ASSERT_EQ(s.eng->save(objs, SaveHost, &state), 0);
  EXPECT_EQ(s.eng->audit_log(), "");
  const EngineConfig cfg = s.eng->config();
  auto dest = std::make_unique<Engine>(cfg, p.net.link_of(s.ip), p.net);
  p.net.attach(s.ip, dest.get());  // datagrams to the address reach the new host from now on
  s.eng.reset();
  p.net.run_for(mo.downtime_ns);
  EngineObjects got;
  std::string err;
  ASSERT_EQ(dest->restore(state.data(), state.size(), RestoreHost, /*qp_owner=*/7, &got, &err), 0) << err;
  ASSERT_EQ(got.pds.size(), 1u);
  ASSERT_EQ(got.cqs.size(), 2u);
  ASSERT_EQ(got.mrs.size(), 1u);
  ASSERT_EQ(got.qps.size(), 1u);
  EXPECT_EQ(got.qps[0]->qpn(), qpn);
  EXPECT_EQ(got.mrs[0]->lkey(), key);
  EXPECT_EQ(impl(*got.qps[0]).init.owner, 7u);
  s.eng = std::move(dest);
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
  Migrate(p, mover, mo);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(p.net.run_until([&] { return AllDone(p.a, p.b, both_ways); }, 20'000'000'000ull))
      << "a: " << p.a.scq->count() << "/" << p.a.rcq->count() << " b: " << p.b.scq->count() << "/"
      << p.b.rcq->count();
  // Nothing more comes, however long the network runs.
  p.net.run_for(100'000'000);
  Seen sa, sb;
  Drain(p.a, sa);
  Drain(p.b, sb);
  CheckWork(p.a, p.b, sa, sb);
  if (both_ways) CheckWork(p.b, p.a, sb, sa);
  else EXPECT_TRUE(sb.sends.empty() && sa.recvs.empty());
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

}  // namespace
}  // namespace vstellar::test
