// Regression tests for daemon-level problems of issue 13, each against an
// in-process daemon and test frontends (as test_device.cc):
//   #10 a kick fd replaced by SET_VRING_KICK stayed in epoll.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "vstellard/daemon.h"
#include "vstellard/frontend.h"

using namespace vstellard;

namespace {

class DaemonSecurity : public ::testing::Test {
 protected:
  std::string dir_, sock_;
  std::unique_ptr<Daemon> d_;
  std::thread t_;

  void StartDaemon(DaemonOptions o = {}) {
    char tmpl[] = "/tmp/vstellard-sec-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    sock_ = dir_ + "/s";
    o.socket = sock_;
    d_ = std::make_unique<Daemon>(o);
    std::string err;
    ASSERT_TRUE(d_->Start(&err)) << err;
    t_ = std::thread([this] { d_->Run(); });
  }
  void TearDown() override {
    if (d_) {
      d_->Stop();
      t_.join();
      d_.reset();
    }
    if (!sock_.empty()) unlink(sock_.c_str());
    if (!dir_.empty()) rmdir(dir_.c_str());
  }
  std::unique_ptr<Frontend> Connect(FrontendOptions fo = {}) {
    auto f = std::make_unique<Frontend>(fo);
    std::string err;
    EXPECT_TRUE(f->Connect(sock_, &err)) << err;
    EXPECT_TRUE(f->StartQueues(&err)) << err;
    return f;
  }
  // Loop turns while nothing is asked of the daemon for `ms`.
  uint64_t IdleWakeups(int ms) {
    const uint64_t w0 = d_->wakeups();
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return d_->wakeups() - w0;
  }
};

// Issue 13 #10: SET_VRING_KICK closed the old kick fd before the daemon
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

}  // namespace
