#!/usr/bin/env bash
# make demo: two guests on a test network run ib_write_bw against each other
# and the result is printed.
#
# The vStellar device (issues 4 and 5) is not in the guests yet, so today the
# demo runs the baseline every later number is compared with: Soft-RoCE (rxe)
# on each guest's virtio-net. When the device lands, this runs ib_write_bw
# over the sprayed transport instead and shows how traffic spread over paths.
set -euo pipefail
cd "$(dirname "$0")/.."

/usr/bin/python3 - "$@" <<'PY'
import sys
sys.path.insert(0, "tools")
import vstellar_guest as vg
import vstellar_perftest as pt

tests = [("ib_write_bw", "-s 65536 -n 500 -F --report_gbits")]
server, client = pt.perftest_pair(tests, "rxe0", setup=pt.RXE_SETUP)
print("vstellar demo: booting two guests (TCG) with rxe on virtio-net; "
      "the vStellar device is not available yet, this is the rxe baseline")
try:
    results = vg.run_guests([server, client], modules=pt.RXE_MODULES, timeout=600,
                            echo=lambda line: print(line, flush=True))
except vg.GuestError as e:
    sys.exit(f"vstellar demo: error: {e}")
for i, (status, out, console) in enumerate(results):
    if status:
        print("\n".join(console), file=sys.stderr)
        sys.exit(f"vstellar demo: guest{i} failed with status {status}")
rows = pt.parse_bw(pt.split_sections(results[1][1])["ib_write_bw " + tests[0][1]])
r = rows[0]
print(f"\nvstellar demo: ib_write_bw over rxe, {r['bytes']} B x {r['iterations']}: "
      f"{r['bw_avg_gbps']:.3f} Gb/s average")
PY
