// Devices as a whole: many attaching, moving data and detaching without a
// trace, per-device object limits, host memory charged to the device that
// asks, node GUIDs.
#include <gtest/gtest.h>

#include <filesystem>

#include "vstellard/datapath_fixture.h"

namespace vstellard::datapath_test {
namespace {

// The process's open file descriptors.
size_t OpenFds() {
  size_t n = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/self/fd")) n += !e.path().empty();
  return n;
}

uint64_t MemoryUsed(Daemon& d) {  // "memory":{"limit":..,"device_limit":..,"used":N
  const std::string j = d.StatsJson();
  const size_t at = j.find("\"used\":", j.find("\"memory\":{\"limit\""));
  return at == std::string::npos ? ~0ull : std::stoull(j.substr(at + 7));
}

}  // namespace

// Device scale: 64 devices on one daemon, each with a context,
// PD, CQ, MR and an RC QP connected to its neighbour's; every pair moves a
// SEND and a WRITE; then the frontends go away. Twice: after each round the
// daemon holds no device, no accounted memory, and the process no more
// file descriptors than before the round (kick/call eventfds, memfds,
// sockets and the mappings behind them are all released).
void DataPath::ManyDevicesAttachMoveDataAndDetachLeavingNothing() {
  StartDaemon();
  constexpr int kDevices = 64;
  for (int round = 0; round < 2; round++) {
    SCOPED_TRACE(round);
    const size_t fds_before = OpenFds();
    std::vector<std::unique_ptr<Frontend>> fs;
    std::vector<std::unique_ptr<Guest>> gs;
    std::vector<GQp> qs;
    for (int i = 0; i < kDevices; i++) {
      FrontendOptions fo;
      fo.mem_size = 8ull << 20;
      fs.push_back(std::make_unique<Frontend>(fo));
      std::string err;
      ASSERT_TRUE(fs.back()->Connect(sock_, &err)) << i << ": " << err;
      ASSERT_TRUE(fs.back()->StartQueues(&err)) << i << ": " << err;
      gs.push_back(std::make_unique<Guest>(Guest{*fs.back()}));
      gs.back()->Setup();
      qs.push_back(gs.back()->CreateQp());
    }
    ASSERT_EQ(d_->Stats().size(), size_t(kDevices));
    EXPECT_GT(MemoryUsed(*d_), 0u);
    // Spread evenly over the workers, each QP on its device's worker.
    unsigned first = ~0u;
    for (const DeviceStats& st : d_->Stats()) first = std::min(first, st.id);
    for (int i = 0; i < kDevices; i++) {
      EXPECT_EQ(d_->WorkerOf(first + unsigned(i)), int(unsigned(i) % threads_)) << i;
      EXPECT_EQ(qs[i].qpn % threads_, unsigned(i) % threads_) << i;
    }
    for (int i = 0; i < kDevices; i += 2) {
      gs[i]->Connect(qs[i], qs[i + 1].qpn);
      gs[i + 1]->Connect(qs[i + 1], qs[i].qpn);
    }
    // Every even device SENDs 3000 bytes to its odd neighbour and WRITEs
    // 5000 bytes into it; all pairs at once.
    for (int i = 0; i < kDevices; i += 2) {
      Fill(gs[i]->Buf(0), 8192, uint8_t(i));
      std::memset(gs[i + 1]->Buf(0), 0, 16384);
      gs[i + 1]->PostRecv(qs[i + 1], 7, {gs[i + 1]->Sge(0, 4096)});
      gs[i]->PostSend(qs[i], Wqe(VSTELLAR_WR_SEND, 1), {gs[i]->Sge(0, 3000)});
      vstellar_send_wqe w = Wqe(VSTELLAR_WR_RDMA_WRITE, 2);
      w.u.rdma.remote_addr = kMrGpa + 8192;
      w.u.rdma.rkey = gs[i + 1]->rkey;
      gs[i]->PostSend(qs[i], w, {gs[i]->Sge(0, 5000)});
    }
    for (int i = 0; i < kDevices; i += 2) {
      for (uint64_t id : {1, 2}) {
        auto c = gs[i]->Poll();
        ASSERT_TRUE(c) << i;
        EXPECT_EQ(c->wr_id, id);
        EXPECT_EQ(c->status, 0);
      }
      auto r = gs[i + 1]->Poll();
      ASSERT_TRUE(r) << i + 1;
      EXPECT_EQ(r->wr_id, 7u);
      EXPECT_EQ(r->byte_len, 3000u);
      EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(0), gs[i]->Buf(0), 3000), 0) << i;
      EXPECT_EQ(std::memcmp(gs[i + 1]->Buf(8192), gs[i]->Buf(0), 5000), 0) << i;
    }
    gs.clear();
    fs.clear();  // the connections close: the daemon destroys the devices
    for (int i = 0; i < 500 && !d_->Stats().empty(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(d_->Stats().empty());
    EXPECT_EQ(MemoryUsed(*d_), 0u);
    EXPECT_EQ(OpenFds(), fds_before);
  }
}

TEST_F(DataPath, ManyDevicesAttachMoveDataAndDetachLeavingNothing) { ManyDevicesAttachMoveDataAndDetachLeavingNothing(); }
TEST_F(DataPathOnTwoThreads, ManyDevicesAttachMoveDataAndDetachLeavingNothing) { ManyDevicesAttachMoveDataAndDetachLeavingNothing(); }

// Per-device object limits (--device-max): the device reports them and
// enforces them with LIMIT; the next device has its own; a limit above the
// device's own maximum is refused at start.
TEST_F(DataPath, DeviceMaxLimitsObjectsPerDevice) {
  StartDaemon(50, {}, [](DaemonOptions& o) {
    o.device_max.qp = 2;
    o.device_max.cq = 1;
  });
  TwoGuests();  // one CQ each
  CmdResult r = fa_->Command(VSTELLAR_CMD_QUERY_DEVICE, 0, nullptr, 0, sizeof(vstellar_resp_query_device));
  ASSERT_EQ(r.status(), 0);
  EXPECT_EQ(As<vstellar_resp_query_device>(r).max_qp, 2u);
  EXPECT_EQ(As<vstellar_resp_query_device>(r).max_cq, 1u);
  for (Guest* g : {a_.get(), b_.get()}) {
    g->CreateQp();
    g->CreateQp();
    uint16_t st = 0;
    g->CreateQp(4, VSTELLAR_QPT_RC, &st);
    EXPECT_EQ(st, VSTELLAR_STATUS_LIMIT);
    vstellar_cmd_create_cq c{};
    c.log_cqe = kLogCqe;
    c.page_shift = 12;
    c.num_pages = 1;
    auto body = WithPages(&c, sizeof(c), {kCqGpa + 0x1000});
    EXPECT_EQ(g->Cmd(VSTELLAR_CMD_CREATE_CQ, body.data(), body.size(), 8).status(), VSTELLAR_STATUS_LIMIT);
  }
  DaemonOptions o;
  o.socket = dir_ + "/t";
  o.device_max.qp = 1025;
  Daemon d(o);
  std::string err;
  EXPECT_FALSE(d.Start(&err));
  EXPECT_NE(err.find("qp=1025"), std::string::npos) << err;
}

// What a guest makes the daemon allocate (here the engine's
// window and rings of each RC QP) is charged to its device and to the
// daemon. Over either limit, creating fails with NO_RESOURCES and nothing
// is allocated; destroying gives the memory back, to any device; the
// daemon's total never passes its limit.
TEST_F(DataPath, HostMemoryIsChargedToTheDeviceThatAsks) {
  StartDaemon(50, {}, [](DaemonOptions& o) {
    o.device_memory_limit = 3ull << 20;
    o.memory_limit = 5ull << 20;
  });
  TwoGuests();
  auto used = [&](const std::string& key) {
    const std::string js = d_->StatsJson();
    const std::string pat = "\"memory\":{\"limit\":";
    size_t at = js.find(pat);
    EXPECT_NE(at, std::string::npos) << js;
    at = js.find("\"" + key + "\":", at);
    return std::stoull(js.substr(at + key.size() + 3));
  };
  auto fill = [&](Guest& g, std::vector<GQp>* made) {
    for (int i = 0; i < 24; i++) {
      uint16_t st = 0;
      GQp q = g.CreateQp(4, VSTELLAR_QPT_RC, &st);
      if (st) return st;
      made->push_back(q);
    }
    return uint16_t(0);
  };
  std::vector<GQp> qa, qb;
  EXPECT_EQ(fill(*a_, &qa), VSTELLAR_STATUS_NO_RESOURCES) << "A's device limit";
  ASSERT_GE(qa.size(), 1u);
  EXPECT_LE(used("used"), 5ull << 20);
  EXPECT_EQ(fill(*b_, &qb), VSTELLAR_STATUS_NO_RESOURCES) << "the daemon's limit";
  ASSERT_GE(qb.size(), 1u);
  EXPECT_LT(qb.size(), qa.size()) << "B got only what A left of the daemon's 5 MiB";
  EXPECT_LE(used("used"), 5ull << 20);
  EXPECT_GE(used("refused"), 1u);
  // A QP of A goes: B may create one more; everything goes: nothing is held.
  vstellar_cmd_handle h{};
  h.handle = qa.back().qpn;
  ASSERT_EQ(a_->Cmd(VSTELLAR_CMD_DESTROY_QP, &h, sizeof(h), 0).status(), 0);
  uint16_t st = 0;
  b_->CreateQp(4, VSTELLAR_QPT_RC, &st);
  EXPECT_EQ(st, 0);
  a_.reset();
  b_.reset();
  fa_.reset();
  fb_.reset();
  for (int i = 0; i < 100 && used("used") != 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(used("used"), 0u);
}

// Node GUIDs: EUI-64 from the daemon's address and the device number, so two
// guests' devices never look like one (ibv_devinfo, rdma_cm).
TEST_F(DataPath, EachDeviceHasItsOwnNodeGuid) {
  StartDaemon();
  TwoGuests();
  std::array<uint8_t, 8> g[2];
  int i = 0;
  for (Guest* x : {a_.get(), b_.get()}) {
    CmdResult r = x->Cmd(VSTELLAR_CMD_QUERY_DEVICE, nullptr, 0, sizeof(vstellar_resp_query_device));
    ASSERT_EQ(r.status(), 0);
    std::memcpy(g[i].data(), As<vstellar_resp_query_device>(r).sys_image_guid, 8);
    EXPECT_EQ(g[i][0], 0x02);  // locally administered
    EXPECT_EQ(g[i][3], 0xff);
    EXPECT_EQ(g[i][4], 0xfe);
    EXPECT_EQ(g[i][1], 127);   // the daemon's 127.0.0.1
    i++;
  }
  EXPECT_NE(g[0], g[1]);
}

// --locate-faults: the worker traces its paths and runs the locator beside
// the data path. Two devices of one daemon talk over loopback, where no
// router answers: every probe reaches the peer engine, which drops it as
// a probe (not a bad packet), the WRITEs all land, and no fault is named.
TEST_F(DataPath, LocatingFaultsTracesPathsAndNamesNothingOnAHealthyNetwork) {
  StartDaemon(50, {}, [](DaemonOptions& o) { o.locate_faults = true; });
  TwoGuests();
  GQp qa = a_->CreateQp(), qb = b_->CreateQp();
  a_->Connect(qa, qb.qpn);
  b_->Connect(qb, qa.qpn);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  int n = 0;
  while (std::chrono::steady_clock::now() < until) {
    auto w = Wqe(VSTELLAR_WR_RDMA_WRITE, uint64_t(n));
    w.u.rdma.remote_addr = kMrGpa;
    w.u.rdma.rkey = b_->rkey;
    a_->PostSend(qa, w, {a_->Sge(0, 4096)});
    auto c = a_->Poll();
    ASSERT_TRUE(c) << n;
    ASSERT_EQ(c->status, 0) << n;
    n++;
  }
  const std::string json = d_->StatsJson();
  EXPECT_NE(json.find("\"faults\":[]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"fault_history\":[]"), std::string::npos) << json;
  ASSERT_NE(json.find("\"localization\":[{\"worker\":0,"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"active_paths\":0,"), std::string::npos) << "the locator saw no traffic: " << json;
  if (geteuid() == 0) {  // raw sockets: the probes went out and reached the peer engine
    EXPECT_NE(json.find("\"tracer_ok\":true"), std::string::npos) << json;
    EXPECT_EQ(json.find("\"trace_probes\":0,"), std::string::npos) << json;
  }
}

}  // namespace vstellard::datapath_test
