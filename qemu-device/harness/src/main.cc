#include "vstellar/harness/harness.h"

int main(int argc, char** argv) {
  vstellar::harness::Options o;
  int code = 0;
  if (!vstellar::harness::parse_args(argc, argv, o, code)) return code;
  if (o.role == "server") return vstellar::harness::run_server(o);
  if (o.role == "client") return vstellar::harness::run_client(o);
  return vstellar::harness::run_pair(o);
}
