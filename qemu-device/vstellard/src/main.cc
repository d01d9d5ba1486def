// vstellard: the host daemon behind vhost-user-vstellar-pci. One process
// is one emulated Stellar RNIC; every QEMU connection on its socket is one
// virtual device, created when the connection is accepted and destroyed
// when it closes.
//
// Today it serves the vhost-user session (handshake, memory table, vrings,
// config space); the control-queue handler and the engine attach to the
// session's recorded regions and vrings next.
#include <getopt.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "vstellard/vhost_user.h"

namespace {

std::atomic<unsigned> next_device{0};

void Log(const char* fmt, auto... args) {
  std::fprintf(stderr, "vstellard: ");
  std::fprintf(stderr, fmt, args...);
  std::fputc('\n', stderr);
}

void Serve(int sock) {
  using clock = std::chrono::steady_clock;
  const unsigned id = next_device++;
  const auto t0 = clock::now();
  vstellard::Session session(vstellard::DeviceConfig::Default());
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - t0).count();
  Log("device %u: created in %lld us", id, static_cast<long long>(us));

  std::string err;
  vstellard::Message m;
  while (vstellard::ReadMessage(sock, &m, &err)) {
    const uint32_t req = m.hdr.request;
    vstellard::Outcome out = session.Handle(std::move(m));
    if (out.reply && !vstellard::WriteAll(sock, *out.reply, &err)) break;
    if (!out.ok()) {
      err = out.error;
      Log("device %u: request %u refused: %s", id, req, err.c_str());
      break;
    }
    if (req == static_cast<uint32_t>(vstellard::Request::kSetMemTable)) {
      for (const auto& r : session.regions())
        Log("device %u: region gpa 0x%llx size 0x%llx%s", id, static_cast<unsigned long long>(r.gpa),
            static_cast<unsigned long long>(r.size), r.doorbell ? " (doorbells)" : "");
    }
  }
  Log("device %u: destroyed (%s)", id, err.empty() ? "frontend closed" : err.c_str());
  close(sock);
}

int Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s --socket PATH\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  static const option opts[] = {{"socket", required_argument, nullptr, 's'},
                                {"help", no_argument, nullptr, 'h'},
                                {nullptr, 0, nullptr, 0}};
  for (int c; (c = getopt_long(argc, argv, "s:h", opts, nullptr)) != -1;) {
    if (c == 's') path = optarg;
    else return Usage(argv[0]);
  }
  if (path.empty() || optind != argc) return Usage(argv[0]);
  signal(SIGPIPE, SIG_IGN);

  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    Log("socket path too long: %s", path.c_str());
    return 1;
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  unlink(path.c_str());
  if (lsock < 0 || bind(lsock, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0 || listen(lsock, 16) < 0) {
    Log("cannot listen on %s: %s", path.c_str(), std::strerror(errno));
    return 1;
  }
  Log("listening on %s", path.c_str());
  for (;;) {
    int s = accept4(lsock, nullptr, nullptr, SOCK_CLOEXEC);
    if (s < 0) {
      if (errno == EINTR) continue;
      Log("accept: %s", std::strerror(errno));
      return 1;
    }
    std::thread(Serve, s).detach();
  }
}
