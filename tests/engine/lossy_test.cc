// The transport over a bad link: loss (random, bursty, one lossy path, one
// dead path), duplication, reordering and delay. A random mix of every
// operation must complete exactly once, in order, with the right bytes.
#include <map>
#include <memory>

#include "retries_used.h"
#include "sim_pair.h"
#include "vstellar/ip_text.h"
#include "vstellar/roce_wire.h"

namespace vstellar::test {
namespace {

struct LinkCase {
  const char* name;
  SimImpairment im;
  uint16_t paths = 16;
};

constexpr size_t kStride = 64 * 1024;
constexpr size_t kCounter = 8 * 1024 * 1024 - 64;

struct Outcome {
  uint64_t faa = 0;
};

// Runs `nops` random operations from a to b and checks everything.
void run_mix(Pair& t, int nops, uint64_t seed, uint64_t max_ns = 60'000'000'000ull) {
  std::mt19937_64 rng(seed);
  fill_random(t.a.buf.data(), kStride * nops, seed);
  fill_random(t.b.buf.data(), kStride * nops, seed + 1);
  std::vector<uint8_t> b_before(t.b.buf.begin(), t.b.buf.begin() + kStride * nops);
  std::vector<WrOpcode> ops;
  std::vector<uint32_t> lens;
  std::vector<int> recv_ops;  // op indexes that consume a receive, in order
  uint64_t faas = 0;
  *reinterpret_cast<uint64_t*>(t.b.buf.data() + kCounter) = 0;
  for (int i = 0; i < nops; i++) {
    static const WrOpcode kinds[] = {WrOpcode::RDMA_WRITE, WrOpcode::RDMA_WRITE_WITH_IMM,
                                     WrOpcode::SEND, WrOpcode::SEND_WITH_IMM, WrOpcode::RDMA_READ,
                                     WrOpcode::ATOMIC_FETCH_AND_ADD};
    WrOpcode op = kinds[rng() % 6];
    uint32_t len = uint32_t(rng() % 3 == 0 ? rng() % 200 : rng() % kStride);
    if (op == WrOpcode::ATOMIC_FETCH_AND_ADD) len = 8;
    ops.push_back(op);
    lens.push_back(len);
    if (op == WrOpcode::SEND || op == WrOpcode::SEND_WITH_IMM || op == WrOpcode::RDMA_WRITE_WITH_IMM) {
      { ASSERT_EQ(t.post_recv(t.b, i, i * kStride, uint32_t(kStride)), 0); }
      recv_ops.push_back(i);
    }
  }
  for (int i = 0; i < nops; i++) {
    if (ops[i] == WrOpcode::ATOMIC_FETCH_AND_ADD) {
      Sge sg{t.a.addr(i * kStride), 8, t.a.mr->lkey()};
      SendWr wr;
      wr.wr_id = i;
      wr.opcode = ops[i];
      wr.send_flags = SEND_SIGNALED;
      wr.sg_list = &sg;
      wr.num_sge = 1;
      wr.remote_addr = t.b.addr(kCounter);
      wr.rkey = t.b.mr->rkey();
      wr.compare_add = 1;
      ASSERT_EQ(t.a.eng->post_send(t.a.qp, wr), 0);
      faas++;
    } else {
      ASSERT_EQ(t.post_send(t.a, ops[i], i, i * kStride, lens[i], i * kStride, SEND_SIGNALED,
                            0xabc000 + i),
                0);
    }
  }
  auto sc = t.wait(t.a, t.a.scq, nops, max_ns);
  ASSERT_EQ(sc.size(), size_t(nops)) << "send completions missing";
  for (int i = 0; i < nops; i++) {
    ASSERT_EQ(sc[i].wr_id, uint64_t(i)) << "out of order";
    ASSERT_EQ(sc[i].status, WcStatus::SUCCESS) << i << " " << to_string(sc[i].status);
  }
  auto rc = t.wait(t.b, t.b.rcq, recv_ops.size(), max_ns);
  ASSERT_EQ(rc.size(), recv_ops.size());
  for (size_t k = 0; k < rc.size(); k++) {
    int i = recv_ops[k];
    ASSERT_EQ(rc[k].wr_id, uint64_t(i));
    ASSERT_EQ(rc[k].status, WcStatus::SUCCESS);
    ASSERT_EQ(rc[k].byte_len, lens[i]);
    if (ops[i] != WrOpcode::SEND) {
      ASSERT_EQ(rc[k].imm_data, 0xabc000u + i);
    }
  }
  // Nothing more arrives later: no doubled completion.
  t.net.run_for(20'000'000);
  Wc extra;
  EXPECT_EQ(t.a.eng->poll_cq(t.a.scq, &extra, 1), 0);
  EXPECT_EQ(t.b.eng->poll_cq(t.b.rcq, &extra, 1), 0);
  for (int i = 0; i < nops; i++) {
    const uint8_t* a = t.a.buf.data() + i * kStride;
    const uint8_t* b = t.b.buf.data() + i * kStride;
    switch (ops[i]) {
      case WrOpcode::RDMA_READ:
        ASSERT_EQ(std::memcmp(a, b_before.data() + i * kStride, lens[i]), 0) << "read " << i;
        break;
      case WrOpcode::ATOMIC_FETCH_AND_ADD:
        break;
      default:
        ASSERT_EQ(std::memcmp(a, b, lens[i]), 0) << "op " << i;
        // Bytes after the message in b are untouched.
        if (lens[i] + 16 < kStride) {
          ASSERT_EQ(std::memcmp(b + lens[i], b_before.data() + i * kStride + lens[i], 16), 0);
        }
    }
  }
  // Every fetch-and-add ran exactly once despite duplicates and resends.
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(t.b.buf.data() + kCounter), faas);
}

class Lossy : public ::testing::TestWithParam<LinkCase> {};

TEST_P(Lossy, MixedOperationsSurvive) {
  for (uint64_t seed : {1, 2, 3}) {
    PairOptions o;
    o.seed = seed;
    o.buf_size = 8 << 20;
    o.cfg.num_paths = GetParam().paths;
    o.cfg.window_pkts = 1024;
    o.cap.max_send_wr = 256;
    o.cap.max_recv_wr = 256;
    Pair t(o);
    t.net.impairment = GetParam().im;
    run_mix(t, 100, seed * 7);
    if (HasFatalFailure()) return;
    const EngineStats& s = t.a.eng->stats();
    if (GetParam().im.loss > 0 || GetParam().im.dead_path >= 0 || GetParam().im.lossy_path >= 0 ||
        GetParam().im.burst_enter > 0) {
      EXPECT_GT(s.retx_pkts + t.b.eng->stats().retx_pkts, 0u);
      EXPECT_GT(t.net.stats.dropped, 0u);
    }
    if (GetParam().im.dup > 0) {
      EXPECT_GT(t.net.stats.duplicated, 0u);
    }
    if (GetParam().im.dead_path >= 0) {
      EXPECT_GT(s.paths[GetParam().im.dead_path].timeouts, 0u);
    }
  }
}

SimImpairment make(std::function<void(SimImpairment&)> f) {
  SimImpairment im;
  f(im);
  return im;
}

void bursty(SimImpairment& m) {
  m.burst_enter = 0.01;
  m.burst_exit = 0.2;
  m.burst_loss = 1.0;
}

void reorder_and_jitter(SimImpairment& m) {
  m.reorder = 0.3;
  m.jitter_ns = 20'000;
}

INSTANTIATE_TEST_SUITE_P(
    Links, Lossy,
    ::testing::Values(
        LinkCase{"clean", make([](SimImpairment&) {})},
        LinkCase{"random_loss_5pct", make([](SimImpairment& m) { m.loss = 0.05; })},
        LinkCase{"bursty_loss", make(bursty)},
        LinkCase{"duplicates", make([](SimImpairment& m) { m.dup = 0.2; })},
        LinkCase{"reorder_and_jitter", make(reorder_and_jitter)},
        LinkCase{"one_lossy_path_of_16", make([](SimImpairment& m) {
                   m.lossy_path = 3;
                   m.lossy_path_rate = 0.5;
                 })},
        LinkCase{"one_dead_path_of_16", make([](SimImpairment& m) { m.dead_path = 5; })},
        LinkCase{"dead_path_of_128", make([](SimImpairment& m) { m.dead_path = 77; }), 128},
        LinkCase{"everything", make([](SimImpairment& m) {
                   m.loss = 0.03;
                   m.dup = 0.05;
                   m.reorder = 0.2;
                   m.jitter_ns = 10'000;
                   m.dead_path = 2;
                   m.ce_rate = 0.05;
                 })}),
    [](const auto& info) { return std::string(info.param.name); });

// Plain RoCE v2 mode (EngineConfig::roce): the same mix over one path, in
// PSN order, with go-back-N instead of SACK. Every packet on the wire must
// be RoCE v2 with a correct ICRC (the codec is checked against rxe's own
// packets in roce_wire_test.cc).
class LossyRoce : public ::testing::TestWithParam<LinkCase> {};

PairOptions roce_pair(uint64_t seed, uint32_t path_mtu = MTU_1024) {
  PairOptions o;
  o.seed = seed;
  o.buf_size = 8 << 20;
  o.cfg.window_pkts = 1024;
  o.cap.max_send_wr = 256;
  o.cap.max_recv_wr = 256;
  o.path_mtu = path_mtu;  // MTU_1024: what rxe runs at over a 1500-byte Ethernet
  IpPrefix all;
  EXPECT_TRUE(parse_prefix("10.0.0.0/8", &all));
  o.cfg.roce.peers = {all};
  o.cfg_b = o.cfg;
  o.cfg.roce.local = IpAddr(kIpA);
  o.cfg_b->roce.local = IpAddr(kIpB);
  return o;
}

TEST_P(LossyRoce, MixedOperationsSurviveInOrder) {
  for (uint64_t seed : {1, 2, 3}) {
    Pair t(roce_pair(seed));
    t.net.impairment = GetParam().im;
    uint64_t bad = 0, pkts = 0;
    t.net.tap = [&](uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t>& bytes) {
      roce::IpFields ip;
      ip.src = IpAddr(from);
      ip.dst = IpAddr(to);
      ip.src_port = path;  // a SimNet node's base port is 0
      roce::Packet p;
      pkts++;
      if (roce::parse(bytes.data(), bytes.size(), ip, &p) != roce::ParseError::NONE) bad++;
      return true;
    };
    run_mix(t, 60, seed * 7);
    if (HasFatalFailure()) return;
    EXPECT_GT(pkts, 0u);
    EXPECT_EQ(bad, 0u) << "packets that are not RoCE v2 with a good ICRC";
    const EngineStats& a = t.a.eng->stats();
    const EngineStats& b = t.b.eng->stats();
    EXPECT_EQ(a.roce_bad + b.roce_bad, 0u);
    EXPECT_GT(a.roce_tx, 0u);
    EXPECT_GT(b.roce_rx, 0u);
    if (GetParam().im.loss > 0 || GetParam().im.burst_enter > 0 || GetParam().im.reorder > 0) {
      // Go-back-N is visible on both sides: the responder NAKed a PSN
      // ahead of the expected one, the requester went back.
      EXPECT_GT(b.roce_seq_naks_sent + a.roce_seq_naks_sent, 0u);
      EXPECT_GT(a.roce_seq_naks_rcvd + b.roce_seq_naks_rcvd, 0u);
      EXPECT_GT(a.roce_goback_pkts + b.roce_goback_pkts, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Links, LossyRoce,
    ::testing::Values(
        LinkCase{"clean", make([](SimImpairment&) {})},
        LinkCase{"random_loss_2pct", make([](SimImpairment& m) { m.loss = 0.02; })},
        LinkCase{"bursty_loss", make(bursty)},
        LinkCase{"duplicates", make([](SimImpairment& m) { m.dup = 0.2; })},
        LinkCase{"reorder_and_jitter", make(reorder_and_jitter)},
        LinkCase{"everything_but_a_dead_path", make([](SimImpairment& m) {
                   m.loss = 0.02;
                   m.dup = 0.05;
                   m.reorder = 0.2;
                   m.jitter_ns = 10'000;
                   m.ce_rate = 0.05;
                 })}),
    [](const auto& info) { return std::string(info.param.name); });

// Every path MTU RoCE has: all but a message's last packet carry exactly
// the MTU, as RoCE responders require (and roce_mode.cc's responder
// checks: the mix would fail with NAKs otherwise).
TEST(LossyRoceMtu, EveryPathMtuCarriesTheMix) {
  for (uint32_t mtu : {MTU_256, MTU_512, MTU_2048, MTU_4096}) {
    Pair t(roce_pair(5, mtu));
    t.net.impairment.loss = 0.01;
    run_mix(t, 30, mtu * 3);
    if (HasFatalFailure()) return;
    EXPECT_EQ(t.a.eng->stats().naks_rcvd + t.b.eng->stats().naks_rcvd, 0u) << "mtu enum " << mtu;
  }
}

// A SEND that finds no receive WQE gets an RNR NAK with the responder's
// min_rnr_timer (a timer code in the AETH), and is sent again after it;
// once a receive is posted it completes.
TEST(LossyRoceRnr, ASendWithoutReceiveWaitsOutRnrNaks) {
  Pair t(roce_pair(7));
  int rnr_naks = 0;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    if (from == kIpB && bytes.size() > 13 && bytes[0] == roce::RC_ACK && (bytes[12] >> 5) == roce::AETH_RNR_NAK) {
      EXPECT_EQ(bytes[12] & 31, t.opt.min_rnr_timer) << "the timer code the responder's QP has";
      rnr_naks++;
    }
    return true;
  };
  fill_random(t.a.buf.data(), 5000, 3);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::SEND, 1, 0, 5000, 0), 0);
  t.net.run_for(2'000'000);
  EXPECT_GT(rnr_naks, 0);
  ASSERT_EQ(t.post_recv(t.b, 9, 65536, 8192), 0);
  auto sc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(sc.size(), 1u);
  EXPECT_EQ(sc[0].status, WcStatus::SUCCESS);
  auto rc = t.wait(t.b, t.b.rcq, 1);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].byte_len, 5000u);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data() + 65536, 5000), 0);
}

TEST(LossyRecovery, ResendGoesToAnotherPath) {
  // Every packet first sent on path 0 is lost; all its resends must leave on
  // other paths, so with RR over 4 paths nothing ever needs a second retry.
  PairOptions o;
  o.cfg.num_paths = 4;
  o.cfg.path_algo = PathAlgo::RR;
  o.retry_cnt = 1;
  Pair t(o);
  std::map<uint16_t, int> retx_on;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t path, std::vector<uint8_t>& bytes) {
    wire::Packet p;
    if (from == kIpA && wire::parse(bytes.data(), bytes.size(), p) == wire::ParseError::OK &&
        (p.base.flags & wire::F_RETX))
      retx_on[path]++;
    return !(from == kIpA && path == 0);
  };
  fill_random(t.a.buf.data(), 512 * 1024, 8);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 512 * 1024, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 512 * 1024), 0);
  EXPECT_EQ(retx_on[0], 0);
  EXPECT_GT(retx_on[1] + retx_on[2] + retx_on[3], 0);
  EXPECT_GE(t.a.eng->stats().paths[0].timeouts, 30u);
}

TEST(LossyRecovery, RtoIsTheConfiguredOne) {
  // One lost packet on an otherwise idle connection is resent one RTO later.
  PairOptions o;
  o.cfg.rto_ns = 400'000;
  Pair t(o);
  uint64_t first = 0, resend = 0;
  t.net.tap = [&](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    wire::Packet p;
    if (from != kIpA || wire::parse(bytes.data(), bytes.size(), p) != wire::ParseError::OK)
      return true;
    if (p.base.op != wire::Op::WRITE) return true;
    if (!first) {
      first = t.net.now_ns();
      return false;
    }
    if (!resend) resend = t.net.now_ns();
    return true;
  };
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 100, 0), 0);
  ASSERT_EQ(t.wait(t.a, t.a.scq, 1).size(), 1u);
  EXPECT_GE(resend - first, 400'000u);
  EXPECT_LT(resend - first, 450'000u);
}

TEST(LossyRecovery, ManyMessagesHeavyLossLargeWindow) {
  PairOptions o;
  o.buf_size = 8 << 20;
  o.cfg.num_paths = 128;
  o.cap.max_send_wr = 512;
  o.cap.max_recv_wr = 512;
  Pair t(o);
  t.net.impairment.loss = 0.1;
  t.net.impairment.jitter_ns = 5'000;
  run_mix(t, 120, 99);
}

// A lost READ response costs the resend of what was lost, not of
// the rest of the READ, and a lost READ request (which holds every later
// one at the responder) does not collapse the window or inflate the RTO.
// 1 MiB READs over one path: at 5% loss the responder sends little more
// than the READs' bytes; at 20% loss every READ still completes.
TEST(ReadRecovery, LossCostsTheLostPacketsOnly) {
  for (double loss : {0.05, 0.2}) {
    PairOptions o;
    o.buf_size = 16 << 20;
    o.cfg.num_paths = 1;
    o.cap.max_send_wr = 64;
    o.timeout = 18;
    Pair t(o);
    fill_random(t.b.buf.data(), t.b.buf.size(), 11);
    t.net.impairment.loss = loss;
    t.net.impairment.delay_ns = 10'000;
    const int n = 16;
    for (int i = 0; i < n; i++)
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, i, uint64_t(i % 8) << 20, 1 << 20, uint64_t(i % 8) << 20), 0);
    auto wc = t.wait(t.a, t.a.scq, n, 60'000'000'000ull);
    ASSERT_EQ(wc.size(), size_t(n)) << "loss " << loss;
    for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS) << "loss " << loss;
    EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 8 << 20), 0);
    const double sent = double(t.b.eng->stats().tx_bytes), asked = double(n) * (1 << 20);
    EXPECT_LT(sent, asked * (loss < 0.1 ? 1.3 : 2.0)) << "loss " << loss << ": the responder resent more than what was lost";
  }
}

// A lost READ request costs no timeout: the responder answers the READ
// behind it at once (ReadReqExt::reads_before), and that answer, which came
// over the same path for a request sent later, shows the requester what
// was lost (EngineCore::comp_read_gaps).
TEST(ReadRecovery, ALostReadRequestIsFoundWithoutATimeout) {
  PairOptions o;
  o.cfg.num_paths = 1;
  Pair t(o);
  fill_random(t.b.buf.data(), 256 << 10, 21);
  int requests = 0;
  t.drop_nth(kIpA, wire::Op::READ_REQ, 0, &requests);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 1, 0, 64 << 10, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, 64 << 10, 64 << 10, 64 << 10), 0);
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 128 << 10), 0);
  EXPECT_EQ(requests, 3) << "both requests and one resend";
  EXPECT_EQ(t.b.eng->stats().early_reads, 1u);
  EXPECT_EQ(t.a.eng->stats().read_gap_losses, 16u) << "the 16 answers the lost request asked for";
  EXPECT_EQ(t.a.eng->stats().timeouts, 0u);
}

// A lost READ answer costs no timeout when a later one of the same path
// arrives: only it is asked for again.
TEST(ReadRecovery, ALostReadAnswerIsAskedForAloneWithoutATimeout) {
  PairOptions o;
  o.cfg.num_paths = 1;
  Pair t(o);
  fill_random(t.b.buf.data(), 256 << 10, 22);
  int answers = 0;
  t.drop_nth(kIpB, wire::Op::READ_RESP, 5, &answers);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 1, 0, 64 << 10, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 64 << 10), 0);
  EXPECT_EQ(answers, 17) << "16 answers and one resent";
  EXPECT_EQ(t.a.eng->stats().read_gap_losses, 1u);
  EXPECT_EQ(t.a.eng->stats().timeouts, 0u);
}

// A READ behind a lost WRITE must wait for it (it must see the WRITE): the
// responder holds it and says so (Syndrome::HELD), and the requester
// resends the WRITE at once instead of at its timeout.
TEST(ReadRecovery, AReadHeldBehindALostWriteGetsTheWriteResentAtOnce) {
  PairOptions o;
  o.cfg.num_paths = 1;
  Pair t(o);
  fill_random(t.a.buf.data(), 8192, 23);
  int writes = 0;
  t.drop_nth(kIpA, wire::Op::WRITE, 0, &writes);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 4096, 0, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, 2, 4096, 4096, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.a.buf.data() + 4096, 4096), 0) << "the READ did not see the WRITE";
  EXPECT_EQ(t.b.eng->stats().early_reads, 0u);
  EXPECT_GE(t.b.eng->stats().held_notices_sent, 1u);
  EXPECT_EQ(t.a.eng->stats().held_resends, 1u);
  EXPECT_EQ(t.a.eng->stats().timeouts, 0u);
}

// Early READs never pass what they must see: a WRITE, or an atomic, to the
// place they read, under loss and reordering.
TEST(ReadRecovery, ReadsGoAheadOfReadsOnly) {
  PairOptions o;
  o.cfg.num_paths = 8;
  o.buf_size = 8 << 20;
  Pair t(o);
  t.net.impairment.loss = 0.1;
  t.net.impairment.jitter_ns = 30'000;
  uint64_t id = 0;
  for (int round = 0; round < 30; round++) {
    fill_random(t.a.buf.data(), 65536, 100 + round);
    // READs of other places, a WRITE, then a READ of what it wrote, an
    // atomic and a READ of its word, then more READs.
    for (uint64_t k = 1; k <= 4; k++)
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, id++, k << 20, 65536, k << 20, 0), 0);
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, id++, 0, 65536, 65536, 0), 0);
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, id++, 131072, 65536, 65536, 0), 0);
    ASSERT_EQ(t.post_fetch_add(t.a, id++, 262144, 524288, 1, 0), 0);
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, id++, 262144 + 8, 8, 524288, 0), 0);
    for (uint64_t k = 5; k <= 7; k++)
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_READ, id++, k << 20, 65536, k << 20, k == 7 ? uint32_t(SEND_SIGNALED) : 0u), 0);
    auto wc = t.wait(t.a, t.a.scq, 1, 60'000'000'000ull);
    ASSERT_EQ(wc.size(), 1u);
    ASSERT_EQ(wc[0].wr_id, id - 1);
    ASSERT_EQ(wc[0].status, WcStatus::SUCCESS);
    ASSERT_EQ(std::memcmp(t.a.buf.data(), t.a.buf.data() + 131072, 65536), 0) << "round " << round;
    uint64_t word;
    std::memcpy(&word, t.a.buf.data() + 262144 + 8, 8);
    ASSERT_EQ(word, uint64_t(round + 1)) << "round " << round << ": the READ passed the atomic";
  }
  EXPECT_GT(t.b.eng->stats().early_reads, 0u);
}

// What a test sees of a requester's data packets: when the network was
// handed each PSN (first transmission and resends), and which one it lost.
struct DataLog {
  std::map<uint32_t, std::vector<uint64_t>> sent_at;  // PSN -> times handed to the network
  uint32_t dropped_psn = 0;
  uint64_t dropped_at = 0;
  // The resend of the dropped packet: time after the drop (0: none seen).
  uint64_t resend_after() const {
    auto it = sent_at.find(dropped_psn);
    return it == sent_at.end() || it->second.size() < 2 ? 0 : it->second[1] - dropped_at;
  }
  size_t resent() const {
    size_t n = 0;
    for (auto& [psn, t] : sent_at) n += t.size() - 1;
    return n;
  }
};

// Logs a's data packets (WRITE or SEND) into `log`, and drops the
// `drop`-th (from 0; -1: none) first transmission.
void log_data(Pair& t, DataLog& log, int drop) {
  auto first = std::make_shared<int>(0);
  t.net.tap = [&t, &log, drop, first](uint32_t from, uint32_t, uint16_t, std::vector<uint8_t>& bytes) {
    wire::Packet p;
    if (from != kIpA || wire::parse(bytes.data(), bytes.size(), p) != wire::ParseError::OK) return true;
    if (p.base.op != wire::Op::WRITE && p.base.op != wire::Op::SEND) return true;
    auto& times = log.sent_at[p.base.psn];
    times.push_back(t.net.now_ns());
    if (times.size() == 1 && (*first)++ == drop) {
      log.dropped_psn = p.base.psn;
      log.dropped_at = t.net.now_ns();
      return false;
    }
    return true;
  };
}

// Sends 512 KiB from a's buffer to b's with `op` (one WR), and checks that
// it completed and arrived intact.
void send_512k_intact(Pair& t, WrOpcode op) {
  if (op == WrOpcode::SEND) {
    ASSERT_EQ(t.post_recv(t.b, 7, 0, 512 << 10), 0);
  }
  ASSERT_EQ(t.post_send(t.a, op, 1, 0, 512 << 10, 0), 0);
  auto wc = t.wait(t.a, t.a.scq, 1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 512 << 10), 0);
}

// Issue 30: a data packet lost on one path of a sprayed QP is found as
// soon as a packet sent after it over the same path is acknowledged (a
// path keeps order), and resent then, not at its RTO. Before, WRITE and
// SEND data had no loss signal but the timer: at least 250 us, during
// which a QP whose later WQEs were done stood idle.
class PathGap : public ::testing::TestWithParam<WrOpcode> {};

TEST_P(PathGap, ALostDataPacketIsResentWhenItsPathDeliversALaterOne) {
  const WrOpcode op = GetParam();
  PairOptions o;
  o.cfg.num_paths = 8;
  o.cfg.path_algo = PathAlgo::RR;
  o.cfg.rto_ns = 250'000;
  Pair t(o);
  fill_random(t.a.buf.data(), 512 << 10, 31);
  DataLog log;
  log_data(t, log, 20);
  send_512k_intact(t, op);  // 128 packets, 16 per path
  const EngineStats& s = t.a.eng->stats();
  EXPECT_EQ(s.path_gap_losses, 1u);
  EXPECT_EQ(s.timeouts, 0u);
  EXPECT_EQ(s.retx_pkts, 1u) << "the lost packet alone is resent";
  EXPECT_EQ(log.resent(), 1u);
  // The loss counts against its path, as a timeout would: the fault
  // locator reads these counts to name a lossy link.
  uint64_t lost = 0;
  t.a.eng->for_each_peer_health([&](const Endpoint&, const std::vector<PathHealth>& paths) {
    for (const PathHealth& h : paths) lost += h.lost;
  });
  EXPECT_EQ(lost, 1u);
  // The round trip is 10 us here; the RTO 250 us.
  EXPECT_GT(log.resend_after(), 0u);
  EXPECT_LT(log.resend_after(), 50'000u) << "resent at its timeout, not when its path delivered the next one";
}

INSTANTIATE_TEST_SUITE_P(WriteAndSend, PathGap, ::testing::Values(WrOpcode::RDMA_WRITE, WrOpcode::SEND),
                         [](const auto& info) { return info.param == WrOpcode::SEND ? "Send" : "Write"; });

// The resend of a lost packet is itself judged by its new path: lost again,
// it is found when a later packet of that path arrives.
TEST(PathGapRecovery, ALostResendIsFoundTheSameWay) {
  PairOptions o;
  o.cfg.num_paths = 8;
  o.cfg.path_algo = PathAlgo::RR;
  Pair t(o);
  fill_random(t.a.buf.data(), 1 << 20, 32);
  DataLog log;
  log_data(t, log, 20);
  auto tap = t.net.tap;
  bool lost_again = false;
  t.net.tap = [&](uint32_t from, uint32_t to, uint16_t path, std::vector<uint8_t>& bytes) {
    if (!tap(from, to, path, bytes)) return false;
    auto it = log.sent_at.find(log.dropped_psn);
    if (from == kIpA && log.dropped_at && it != log.sent_at.end() && it->second.size() == 2 && !lost_again) {
      wire::Packet p;
      if (wire::parse(bytes.data(), bytes.size(), p) == wire::ParseError::OK && p.base.psn == log.dropped_psn &&
          (p.base.flags & wire::F_RETX)) {
        lost_again = true;
        return false;
      }
    }
    return true;
  };
  // Two WRITEs: the second keeps every path busy after the first resend.
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 1, 0, 512 << 10, 0), 0);
  ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, 2, 512 << 10, 512 << 10, 512 << 10), 0);
  auto wc = t.wait(t.a, t.a.scq, 2);
  ASSERT_EQ(wc.size(), 2u);
  for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 1 << 20), 0);
  ASSERT_TRUE(lost_again);
  EXPECT_EQ(t.a.eng->stats().path_gap_losses, 2u);
  EXPECT_EQ(t.a.eng->stats().timeouts, 0u);
  EXPECT_LT(log.sent_at[log.dropped_psn].back() - log.dropped_at, 100'000u);
}

// Reordering across paths is no loss: one uplink of the sender queues
// (its paths' packets arrive tens of microseconds after those sent later
// on the others), nothing is lost, and nothing is resent.
TEST(PathGapRecovery, ReorderingAcrossPathsResendsNothing) {
  for (PathAlgo algo : {PathAlgo::RR, PathAlgo::OBS}) {
    PairOptions o;
    o.cfg.num_paths = 16;
    o.cfg.path_algo = algo;
    o.buf_size = 4 << 20;
    Pair t(o);
    t.net.impairment.uplinks = 4;
    const uint16_t slow = t.net.uplink_of(kIpA, 0);
    t.net.impairment.uplink_each.assign(4, SimQueueConfig{});
    t.net.impairment.uplink_each[slow] = {10'000'000'000ull, 0, 0, 0};  // 10 Gb/s; the others: no queue
    fill_random(t.a.buf.data(), 4 << 20, 33);
    DataLog log;
    log_data(t, log, -1);
    for (int i = 0; i < 4; i++)
      ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, uint64_t(i) << 20, 1 << 20, uint64_t(i) << 20), 0);
    auto wc = t.wait(t.a, t.a.scq, 4);
    ASSERT_EQ(wc.size(), 4u) << to_string(algo);
    for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS);
    EXPECT_EQ(std::memcmp(t.a.buf.data(), t.b.buf.data(), 4 << 20), 0);
    // The slow uplink held tens of microseconds of packets at times.
    EXPECT_GT(t.net.uplink_stats(kIpA, slow).max_backlog, 32u << 10) << to_string(algo);
    EXPECT_EQ(t.net.stats.dropped, 0u);
    EXPECT_EQ(t.a.eng->stats().path_gap_losses, 0u) << to_string(algo);
    EXPECT_EQ(t.a.eng->stats().retx_pkts, 0u) << to_string(algo);
    EXPECT_EQ(log.resent(), 0u) << to_string(algo);
  }
}

// Issue 30: with a path per packet, no later packet of the lost one's path
// arrives, and the path-gap rule has nothing to go on. A packet sent once
// is lost when one sent after it arrived and it is overdue (twice the
// slowest round trip since it left): it is resent while the WRITE is still
// being sent. Before, it waited for its RTO (here 1 ms), or for the
// connection to go quiet after the last packet of the WRITE.
TEST(OverdueRule, ALossWithNoLaterPacketOnItsPathIsResentWhileDataFlows) {
  PairOptions o;
  o.cfg.num_paths = 128;
  o.cfg.path_algo = PathAlgo::RR;
  o.cfg.rto_ns = 1'000'000;
  o.cfg.cc.init_cwnd = o.cfg.cc.max_cwnd = 64 << 10;  // 16 packets: the WRITE takes 8 round trips
  Pair t(o);
  fill_random(t.a.buf.data(), 512 << 10, 34);
  DataLog log;
  log_data(t, log, 20);
  send_512k_intact(t, WrOpcode::RDMA_WRITE);  // 128 packets, 1 per path
  const EngineStats& s = t.a.eng->stats();
  EXPECT_EQ(s.overdue_losses, 1u);
  EXPECT_EQ(s.overdue_wrong, 0u);
  EXPECT_EQ(s.path_gap_losses, 0u);
  EXPECT_EQ(s.quiet_losses, 0u);
  EXPECT_EQ(s.timeouts, 0u);
  EXPECT_EQ(s.retx_pkts, 1u) << "the lost packet alone is resent";
  ASSERT_EQ(log.resent(), 1u);
  uint64_t last_first_tx = 0;
  for (auto& [psn, times] : log.sent_at) last_first_tx = std::max(last_first_tx, times.front());
  EXPECT_LT(log.sent_at[log.dropped_psn].back(), last_first_tx) << "resent only once the WRITE was all sent";
}

// A path that queues far beyond the others is no loss either: with one
// packet per path and a quarter of the paths through an uplink of a fifth
// of the others' rate, whose queue grows to milliseconds, nothing is taken
// for lost. The connection's slowest round trip comes from the packets
// its ACKs echo, seldom the slow uplink's; the rule measures each path's
// own round trip too (and waits longer after a wrong verdict).
TEST(OverdueRule, APathThatQueuesIsNotTakenForLossy) {
  PairOptions o;
  o.cfg.num_paths = 128;
  o.cfg.path_algo = PathAlgo::RR;
  o.buf_size = 4 << 20;
  Pair t(o);
  t.net.impairment.uplinks = 4;
  const uint16_t slow = t.net.uplink_of(kIpA, 0);
  t.net.impairment.uplink_each.assign(4, SimQueueConfig{1'000'000'000ull, 1 << 20, 32 << 10, 0});
  t.net.impairment.uplink_each[slow].rate_bps = 200'000'000ull;  // a fifth of the others' rate
  for (int i = 0; i < 8; i++)
    ASSERT_EQ(t.post_send(t.a, WrOpcode::RDMA_WRITE, i, 0, 4 << 20, 0), 0);
  t.net.run_for(30'000'000);  // past the first window's burst, which overflows the slow uplink
  const EngineStats before = t.a.eng->stats();
  auto wc = t.wait(t.a, t.a.scq, 8);
  ASSERT_EQ(wc.size(), 8u);
  for (const Wc& w : wc) EXPECT_EQ(w.status, WcStatus::SUCCESS);
  const EngineStats& s = t.a.eng->stats();
  EXPECT_GT(t.net.uplink_stats(kIpA, slow).max_backlog, 32u << 10);
  EXPECT_EQ(s.overdue_losses - before.overdue_losses, 0u);
  EXPECT_EQ(s.retx_pkts - before.retx_pkts, 0u);
}

// A requester whose engine is descheduled (a loaded host) for longer than
// its QP's retry limit, just after the network lost everything for a
// while (its oldest packet has used its retries): when it runs again its
// timers fire before it reads the datagrams that waited for it. The time
// it did not run is not its peer's silence (EngineCore::forgive_lateness):
// it resends, and the WRITE completes. Before, it failed with RETRY_EXC at
// its first timer.
TEST(Lossy, ADescheduledRequesterDoesNotCountItsOwnAbsenceAgainstItsPeer) {
  Pair p;
  bool drop;
  ASSERT_TRUE(write_until_retries_used(p, 9, &drop));
  drop = false;
  p.net.freeze(kIpA, p.net.now_ns() + 2'000'000'000);  // then 2 s without running
  auto done = p.wait(p.a, p.a.scq, 1);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::SUCCESS);
  EXPECT_EQ(std::memcmp(p.b.buf.data(), p.a.buf.data(), 65536), 0);
  EXPECT_GE(p.a.eng->stats().late_passes, 1u);
}

}  // namespace
}  // namespace vstellar::test
