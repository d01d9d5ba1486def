// A GoogleTest fixture with an in-process vstellard on a unix socket in a
// fresh directory, run on its own thread, and test frontends that connect
// to it the way QEMU does (device_test.cc, security_daemon_test.cc).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <thread>

#include "vstellard/daemon.h"
#include "vstellard/frontend.h"

namespace vstellard {

class DaemonTest : public ::testing::Test {
 protected:
  std::string dir_, sock_;
  std::unique_ptr<Daemon> d_;
  std::thread t_;

  void StartDaemon(DaemonOptions o = {}) {
    char tmpl[] = "/tmp/vstellard-test-XXXXXX";
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
  // A frontend connected with its queues started (a device is created).
  std::unique_ptr<Frontend> Connect(FrontendOptions fo = {}) {
    auto f = std::make_unique<Frontend>(fo);
    std::string err;
    EXPECT_TRUE(f->Connect(sock_, &err)) << err;
    EXPECT_TRUE(f->StartQueues(&err)) << err;
    return f;
  }
};

}  // namespace vstellard
