// Regression tests for daemon-level problems, each against an
// in-process daemon and test frontends (as device_test.cc):
//   - a device that keeps its control queue full starved the others;
//   - one byte of a vhost-user header stopped the daemon;
//   - a kick fd replaced by SET_VRING_KICK stayed in epoll.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <cstring>
#include <memory>
#include <thread>

#include "vstellard/daemon_test.h"

using namespace vstellard;

namespace {

class DaemonSecurity : public DaemonTest {
 protected:
  // Loop turns while nothing is asked of the daemon for `ms`.
  uint64_t IdleWakeups(int ms) {
    const uint64_t w0 = d_->wakeups();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return d_->wakeups() - w0;
  }
};

// SET_VRING_KICK closed the old kick fd before the daemon
// took it out of epoll, so the registration stayed (the frontend still
// holds the eventfd) and could not be removed any more. A write to the old
// eventfd then woke the loop forever (it is never read): a busy loop.
TEST_F(DaemonSecurity, ReplacedKickFdLeavesEpoll) {
  StartDaemon();
  auto f = Connect();
  ASSERT_TRUE(f->Alive());
  const int fresh = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  uint64_t q = VSTELLAR_VQ_CONTROL;
  std::string err;
  ASSERT_TRUE(f->Send(Request::kSetVringKick, &q, 8, &err, {fresh}, true)) << err;
  IdleWakeups(100);  // settle
  f->Kick(VSTELLAR_VQ_CONTROL);  // the frontend's old kick eventfd
  EXPECT_LT(IdleWakeups(300), 50u) << "the replaced kick fd still wakes the loop";
  EXPECT_TRUE(f->Alive());
  close(fresh);
}

// ProcessControl ran while the control queue had requests,
// with no budget. A guest that refills its queue as fast as the device
// empties it (here: the after-copy hook re-posts one request for each it
// takes, a guest kernel on another CPU) kept the loop in that one device,
// and another device's ALLOC_PD waited for the flood to end. With the
// per-turn budget the other device is served within a few turns: while it
// waits, the flooder gets at most a few budgets' worth of commands.
TEST_F(DaemonSecurity, ControlQueueFloodDoesNotStarveAnotherDevice) {
  constexpr uint64_t kFloodLimit = 200'000;
  constexpr uint32_t kBudget = 16;
  std::atomic<bool> flooding{false}, victim_served{false};
  std::atomic<uint64_t> flood_count{0}, flood_at_victim{0};
  Frontend* flooder = nullptr;
  const std::vector<Frontend::DescSpec> junk = {
      {Frontend::kReqGpa, uint32_t(sizeof(vstellar_cmd_hdr)), false},
      {Frontend::kRespGpa, uint32_t(sizeof(vstellar_resp_hdr) + 64), true}};
  DaemonOptions o;
  o.control_budget = kBudget;
  StartDaemon(o);
  d_->SetAfterCopyHook([&](unsigned dev) {
    if (dev == 0 && flooding) {
      // The flooding guest refills its ring: one new request per one taken.
      if (++flood_count < kFloodLimit && !victim_served) flooder->Post(VSTELLAR_VQ_CONTROL, junk, false);
    } else if (dev == 1 && !victim_served) {
      flood_at_victim = flood_count.load();
      victim_served = true;
    }
  });
  auto f0 = Connect();  // device 0: the flooder
  auto f1 = Connect();  // device 1: the victim
  flooder = f0.get();
  // An unknown opcode: refused (BAD_OPCODE) at once, however often.
  vstellar_cmd_hdr h{};
  std::memcpy(f0->mem() + Frontend::kReqGpa, &h, sizeof(h));
  for (int i = 0; i < 8; i++) f0->Post(VSTELLAR_VQ_CONTROL, junk, false);
  flooding = true;
  f0->Kick(VSTELLAR_VQ_CONTROL);
  while (flood_count < 1000) std::this_thread::yield();
  // The victim's ALLOC_PD, posted and kicked by hand so the flood count is
  // read after the kick (this thread may be descheduled in between).
  vstellar_cmd_hdr ph{};
  ph.opcode = htole16(VSTELLAR_CMD_ALLOC_PD);
  std::memcpy(f1->mem() + Frontend::kReqGpa, &ph, sizeof(ph));
  f1->Post(VSTELLAR_VQ_CONTROL, {{Frontend::kReqGpa, uint32_t(sizeof(ph)), false},
                                 {Frontend::kRespGpa, uint32_t(sizeof(vstellar_resp_hdr) + 8), true}});
  const uint64_t flood_at_kick = flood_count;
  uint16_t head;
  uint32_t used_len = 0;
  ASSERT_TRUE(f1->WaitUsed(VSTELLAR_VQ_CONTROL, &head, &used_len, 20000));
  vstellar_resp_hdr rh{};
  std::memcpy(&rh, f1->mem() + Frontend::kRespGpa, sizeof(rh));
  EXPECT_EQ(le16toh(rh.status), VSTELLAR_STATUS_OK);
  ASSERT_TRUE(victim_served);
  const uint64_t meanwhile = flood_at_victim > flood_at_kick ? flood_at_victim - flood_at_kick : 0;
  // A few turns of the flooder's budget at most (one turn to see the kick,
  // one to serve it; slack for the test thread's scheduling).
  EXPECT_LE(meanwhile, 8u * kBudget) << "the flooding device ran " << meanwhile
                                     << " commands while another device's ALLOC_PD waited";
  EXPECT_LT(flood_at_victim.load(), kFloodLimit - 1) << "served only after the flood ended";
}

// The vhost-user sockets were read blocking with MSG_WAITALL, so
// a frontend that sent one header byte and stopped held the loop in
// recvmsg: no other device was served. Now the partial message waits in
// the connection's buffer, the other device works, and the stalled
// connection is closed after --vhost-timeout-ms.
TEST_F(DaemonSecurity, OneHeaderByteDoesNotBlockOtherDevices) {
  DaemonOptions o;
  o.vhost_timeout_ms = 300;
  StartDaemon(o);
  auto f = Connect();
  const int stall = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, sock_.c_str(), sock_.size());
  ASSERT_EQ(connect(stall, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const uint8_t one = 1;  // the first byte of a GET_FEATURES header
  ASSERT_EQ(send(stall, &one, 1, MSG_NOSIGNAL), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // The other device, from another thread: if the daemon is stuck, the
  // stalled socket is closed after 3 s to free it and the test fails.
  auto victim = std::async(std::launch::async, [&] {
    return f->Command(VSTELLAR_CMD_ALLOC_PD, 0, nullptr, 0, 8, 10000);
  });
  const bool in_time = victim.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
  if (!in_time) shutdown(stall, SHUT_RDWR);
  CmdResult r = victim.get();
  EXPECT_TRUE(in_time) << "a connection holding one header byte blocked another device";
  EXPECT_TRUE(r.done);
  EXPECT_EQ(r.status(), VSTELLAR_STATUS_OK);
  // The stalled connection is closed after the timeout (EOF on our side).
  pollfd p{stall, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 3000), 1) << "the stalled connection was not closed";
  char b;
  EXPECT_EQ(recv(stall, &b, 1, MSG_DONTWAIT), 0);
  EXPECT_TRUE(f->Alive());
  close(stall);
}

// Memory that cannot be sealed against shrinking (QEMU's doorbell memfd
// before it was made with seals) could be truncated by its owner under the
// daemon's mappings, and a later access would fault. Such a memory table is
// refused: that device goes, and the daemon serves the others.
TEST_F(DaemonSecurity, UnsealableGuestMemoryIsRefused) {
  StartDaemon();
  FrontendOptions fo;
  fo.sealable_doorbell = false;
  Frontend bad(fo);
  std::string err;
  const bool up = bad.Connect(sock_, &err) && bad.StartQueues(&err);
  EXPECT_FALSE(up) << "an unsealable region was accepted";
  auto good = Connect();
  EXPECT_EQ(good->Command(VSTELLAR_CMD_ALLOC_PD, 0, nullptr, 0, 8).status(), VSTELLAR_STATUS_OK);
}

}  // namespace
