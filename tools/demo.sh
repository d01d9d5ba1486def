#!/bin/sh
# make demo: two guests with the vStellar device run ib_write_bw against each
# other over the sprayed transport on a namespace Clos, and the demo prints
# the bandwidth and how the traffic spread over the fabric's paths. The code
# and its options are in tools/python/vstellar/demo.py.
exec "$(dirname "$0")/python/run" vstellar.demo "$@"
