// Moving the device state through a pipe; see include/vstellard/state_transfer.h.
#include "vstellard/state_transfer.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vstellard {

void StateTransfer::StartSave(Fd fd, std::vector<uint8_t> bytes) {
  Cancel();
  bytes_ = std::move(bytes);
  thread_ = std::thread([this, f = fd.release()] { Run(Fd(f), true); });
}

void StateTransfer::StartLoad(Fd fd, size_t max) {
  Cancel();
  bytes_.clear();
  max_ = max;
  thread_ = std::thread([this, f = fd.release()] { Run(Fd(f), false); });
}

void StateTransfer::Run(Fd fd, bool save) {
  // A write to a pipe whose reader is gone raises SIGPIPE in the writing
  // thread: blocked here, the write fails with EPIPE instead.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
    error_ = std::string("fcntl: ") + strerror(errno);
    done_ = true;
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  size_t done = 0;
  uint8_t buf[65536];
  for (;;) {
    if (cancel_) {
      error_ = "cancelled";
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      error_ = "the frontend did not " + std::string(save ? "read" : "send") + " the state within " +
               std::to_string(kTimeout.count()) + " s";
      break;
    }
    pollfd p{fd.get(), short(save ? POLLOUT : POLLIN), 0};
    const int r = poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) {
      error_ = std::string("poll: ") + strerror(errno);
      break;
    }
    if (r <= 0) continue;
    if (save) {
      if (done == bytes_.size()) break;
      const ssize_t n = write(fd.get(), bytes_.data() + done, bytes_.size() - done);
      if (n < 0 && errno != EAGAIN && errno != EINTR) {
        error_ = std::string("writing the state: ") + strerror(errno);
        break;
      }
      if (n > 0) done += size_t(n);
      if (done == bytes_.size()) break;
    } else {
      const ssize_t n = read(fd.get(), buf, sizeof(buf));
      if (n == 0) break;  // EOF: all of it
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        error_ = std::string("reading the state: ") + strerror(errno);
        break;
      }
      if (bytes_.size() + size_t(n) > max_) {
        error_ = "the state is larger than " + std::to_string(max_) + " bytes";
        break;
      }
      bytes_.insert(bytes_.end(), buf, buf + n);
    }
  }
  done_ = true;  // fd closes as the thread returns: the frontend's EOF
}

bool StateTransfer::Finish(std::chrono::milliseconds wait, std::vector<uint8_t>* out, std::string* err) {
  if (!thread_.joinable()) {
    *err = "no state transfer was started";
    return false;
  }
  const auto until = std::chrono::steady_clock::now() + wait;
  while (!done_ && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!done_) {
    Cancel();
    *err = "the state transfer did not finish in time";
    return false;
  }
  thread_.join();
  done_ = false;
  if (!error_.empty()) {
    *err = error_;
    error_.clear();
    return false;
  }
  if (out) *out = std::move(bytes_);
  bytes_.clear();
  return true;
}

void StateTransfer::Cancel() {
  if (!thread_.joinable()) return;
  cancel_ = true;
  thread_.join();
  cancel_ = false;
  done_ = false;
  error_.clear();
  bytes_.clear();
}

}  // namespace vstellard
