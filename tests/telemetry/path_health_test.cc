// The engine's per-peer path health (Engine::for_each_peer_health), the
// evidence the fault locator reads, and the drop of a tracer's probe.
#include <gtest/gtest.h>

#include "../engine/sim_pair.h"
#include "vstellar/wire.h"

namespace vstellar::test {
namespace {

std::vector<PathHealth> health_of_b(Engine& e) {
  std::vector<PathHealth> out;
  e.for_each_peer_health([&](const Endpoint& peer, const std::vector<PathHealth>& paths) {
    if (peer.ip == IpAddr(kIpB)) out = paths;
  });
  return out;
}

PairOptions eight_paths() {
  PairOptions o;
  o.cfg.num_paths = 8;
  return o;
}

// 64 WRITEs of 16 KiB from A, all completed.
void write_64(Pair& p) {
  for (int i = 0; i < 64; i++) ASSERT_EQ(p.post_send(p.a, WrOpcode::RDMA_WRITE, i, 0, 16384, 0), 0);
  ASSERT_EQ(p.wait(p.a, p.a.scq, 64).size(), 64u);
}

TEST(PathHealth, CountsWhatEachPathTowardsAPeerSentDeliveredAndLost) {
  Pair p(eight_paths());
  const int dead = 5;
  p.net.impairment.dead_path = dead;
  write_64(p);
  const std::vector<PathHealth> h = health_of_b(*p.a.eng);
  ASSERT_EQ(h.size(), 8u);
  uint64_t lost_elsewhere = 0;
  for (int i = 0; i < 8; i++) {
    EXPECT_GT(h[i].sent, 0u) << "path " << i;
    if (i == dead) {
      EXPECT_EQ(h[i].delivered, 0u);
      EXPECT_EQ(h[i].answered, 0u);
      EXPECT_GT(h[i].lost, 0u);
    } else {
      EXPECT_GT(h[i].delivered, 0u) << "path " << i;
      lost_elsewhere += h[i].lost;
    }
    if (h[i].answered) {
      EXPECT_GT(h[i].rtt_sum_ns, 0u);
    }
  }
  EXPECT_EQ(lost_elsewhere, 0u);
  // B sent nothing but ACKs: it has no requests to account for.
  bool b_has_any = false;
  p.b.eng->for_each_peer_health([&](const Endpoint&, const std::vector<PathHealth>& paths) {
    for (const PathHealth& x : paths) b_has_any |= x.sent > 0;
  });
  EXPECT_FALSE(b_has_any);
}

// `down` is a state: the QPs that hold the path set aside now, the
// engine's own verdict the locator takes as a dead path's evidence.
TEST(PathHealth, DownNamesThePathsItsQpsHoldAsideNow) {
  Pair p(eight_paths());
  const int dead = 5;
  p.net.impairment.dead_path = dead;
  write_64(p);
  std::vector<PathHealth> h = health_of_b(*p.a.eng);
  ASSERT_EQ(h.size(), 8u);
  for (int i = 0; i < 8; i++) EXPECT_EQ(h[i].down, i == dead ? 1u : 0u) << "path " << i;
  // Repaired: a probe copy over it is answered, and it is up again. (An
  // ACK names only the last packet to arrive before it left; before the
  // responder answered a probe copy at once, none of the 11 copies that
  // arrived here over 500 ms was that packet, and the path stayed aside.)
  p.net.impairment.dead_path = -1;
  for (int round = 0; round < 50 && health_of_b(*p.a.eng)[dead].down; round++) {
    write_64(p);
    p.net.run_for(10'000'000);  // past the probe hold, which doubles per unanswered probe
  }
  h = health_of_b(*p.a.eng);
  for (int i = 0; i < 8; i++) EXPECT_EQ(h[i].down, 0u) << "path " << i;
}

TEST(PathHealth, ATracerProbeThatReachesTheEngineIsDroppedAndCounted) {
  Pair p;
  std::vector<uint8_t> probe(wire::kTraceProbeLen, 0);
  std::memcpy(probe.data(), wire::kTraceMagic, sizeof(wire::kTraceMagic));
  p.net.inject(kIpA, kIpB, probe);
  p.net.run_for(1'000'000);
  EXPECT_EQ(p.b.eng->stats().trace_probes, 1u);
  EXPECT_EQ(p.b.eng->stats().bad_parse, 0u);
  EXPECT_EQ(p.b.eng->stats().rx_pkts, 0u);
  // One byte more is not a probe: a bad packet as any other.
  probe.push_back(0);
  p.net.inject(kIpA, kIpB, probe);
  p.net.run_for(1'000'000);
  EXPECT_EQ(p.b.eng->stats().trace_probes, 1u);
  EXPECT_EQ(p.b.eng->stats().bad_parse, 1u);
}

TEST(PathHealth, TracksAtMostkMaxHealthPeersPeers) {
  // A guest that connects QPs to ever new addresses must not grow the
  // table without bound.
  SimNet net;
  Link& l = net.add_node(kIpA);
  EngineConfig c;
  c.num_paths = 4;
  Engine e(c, l, net);
  net.attach(kIpA, &e);
  Pd* pd = e.alloc_pd();
  Cq* cq = e.create_cq(16);
  std::vector<uint8_t> buf(4096);
  Mr* mr = e.reg_mr(pd, uint64_t(uintptr_t(buf.data())), buf.size(), ACCESS_LOCAL_WRITE,
                    std::make_shared<HostMemory>());
  ASSERT_NE(mr, nullptr);
  for (uint32_t k = 0; k < Engine::kMaxHealthPeers + 8; k++) {
    QpInitAttr init;
    init.send_cq = init.recv_cq = cq;
    init.qp_type = QpType::RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 4;
    Qp* qp = e.create_qp(pd, init);
    ASSERT_NE(qp, nullptr);
    QpAttr a;
    a.qp_state = QpState::INIT;
    a.qp_access_flags = ACCESS_REMOTE_WRITE;
    ASSERT_EQ(e.modify_qp(qp, a, QP_STATE | QP_PKEY_INDEX | QP_PORT | QP_ACCESS_FLAGS), 0);
    a.qp_state = QpState::RTR;
    a.ah = Endpoint{IpAddr(0x0b000000 + k), 4791};
    a.dest_qp_num = 100;
    a.rq_psn = 1;
    a.path_mtu = MTU_4096;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    ASSERT_EQ(e.modify_qp(qp, a,
                          QP_STATE | QP_AV | QP_PATH_MTU | QP_DEST_QPN | QP_RQ_PSN | QP_MAX_DEST_RD_ATOMIC |
                              QP_MIN_RNR_TIMER),
              0);
    a.qp_state = QpState::RTS;
    a.sq_psn = 1;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(e.modify_qp(qp, a,
                          QP_STATE | QP_SQ_PSN | QP_TIMEOUT | QP_RETRY_CNT | QP_RNR_RETRY | QP_MAX_QP_RD_ATOMIC),
              0);
    SendWr wr;
    wr.opcode = WrOpcode::RDMA_WRITE;
    Sge sg{uint64_t(uintptr_t(buf.data())), 64, mr->lkey()};
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.remote_addr = 0x1000;
    wr.rkey = 1;
    ASSERT_EQ(e.post_send(qp, wr), 0);
    e.progress();
  }
  size_t peers = 0;
  e.for_each_peer_health([&](const Endpoint&, const std::vector<PathHealth>&) { peers++; });
  EXPECT_EQ(peers, Engine::kMaxHealthPeers);
}

}  // namespace
}  // namespace vstellar::test
