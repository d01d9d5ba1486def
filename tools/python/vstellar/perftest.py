"""perftest between two guests: the commands to run and the parser of results.

Shared by the guest tests, `make demo` and `make bench`, so that all three run
perftest the same way. Guest 0 is the server, guest 1 the client.
"""

import re

from vstellar.guest import RXE_MODULES, guest_ip  # noqa: F401 (RXE_MODULES: the rxe baseline's)

RXE_SETUP = "rdma link add rxe0 type rxe netdev eth0 || exit 1\n"

# The vStellar device: vstellar.ko is loaded by the launcher (run_guests
# vstellar=True). Wait for vstellar0 and for the RoCE v2 GID of eth0's IPv4
# address (the core fills the GID table from the net device's addresses,
# after /init gives eth0 its address) and export its index as $GIDX: the
# daemons send to the IPv4 inside the destination GID, so the IPv4-mapped
# GID is the one to use (index 0 is usually the IPv6 link-local one).
VSTELLAR_DEVICE = "vstellar0"


def wait_roce_gid(dev, var="GIDX", seconds=10):
    """Shell: wait until DEV has an IPv4-mapped RoCE v2 GID and export its
    index as var (up to `seconds`: the kernel adds GIDs as the netdev comes
    up; a device being hot-plugged needs longer)."""
    return f"""\
roce_gid() {{
  p=/sys/class/infiniband/$1/ports/1
  for g in $p/gids/*; do
    i=${{g##*/}}
    case "$(cat $g 2>/dev/null)" in
      0000:0000:0000:0000:0000:ffff:*)
        [ "$(cat $p/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && {{ echo $i; return 0; }} ;;
    esac
  done
  return 1
}}
n=0
until {var}=$(roce_gid {dev}); do
  n=$((n + 1)); [ $n -lt {seconds * 10} ] || {{ echo "no IPv4 RoCE v2 GID on {dev}" >&2; ls /sys/class/infiniband >&2; exit 1; }}
  sleep 0.1
done
export {var}
"""


VSTELLAR_SETUP = wait_roce_gid(VSTELLAR_DEVICE)


def wait_roce_gid6(dev):
    """Shell: wait until DEV has a RoCE v2 GID of a global IPv6 address
    (neither link-local fe80:: nor IPv4-mapped: eth0's fd77::<i+1> of
    run_guests(ipv6=True)) and export its index as GIDX6 (up to 10 s).
    Its place in the table depends on the order the kernel adds eth0's
    addresses, so it is looked up, never assumed."""
    return f"""\
roce_gid6() {{
  p=/sys/class/infiniband/$1/ports/1
  for g in $p/gids/*; do
    i=${{g##*/}}
    case "$(cat $g 2>/dev/null)" in
      ""|fe80:*|0000:0000:0000:0000:0000:ffff:*|0000:0000:0000:0000:0000:0000:0000:0000) ;;
      *) [ "$(cat $p/gid_attrs/types/$i 2>/dev/null)" = "RoCE v2" ] && {{ echo $i; return 0; }} ;;
    esac
  done
  return 1
}}
n=0
until GIDX6=$(roce_gid6 {dev}); do
  n=$((n + 1)); [ $n -lt 100 ] || {{ echo "no IPv6 RoCE v2 GID on {dev}" >&2; cat /sys/class/infiniband/{dev}/ports/1/gids/* >&2; exit 1; }}
  sleep 0.1
done
export GIDX6
"""
VSTELLAR_COMMON = "-x $GIDX"

def client_retry(not_listening, tries=60):
    """A shell function `run_client CMD...`: runs CMD until it succeeds,
    retrying (once a second, at most `tries` times) only while its output
    matches the grep pattern `not_listening` (the server does not listen
    yet); then prints CMD's output. CMD's output goes to $CLIENT_OUT
    (/tmp/client.out if unset) meanwhile: clients that run at once each
    set their own.

    "No route to host" is always retried: the peer guest may not have its
    address yet (TCG boots the two guests at different speeds, and the
    client's own setup does not wait for the peer's), and an unanswered
    ARP request ends a TCP connect with EHOSTUNREACH, as it did in a
    test_libfabric run whose client tried once before the server was up."""
    not_listening += "\\|No route to host"
    return f"""\
run_client() {{
  i=0
  out=${{CLIENT_OUT:-/tmp/client.out}}
  while [ $i -lt {tries} ]; do
    "$@" > $out 2>&1 && {{ cat $out; return 0; }}
    grep -q "{not_listening}" $out || {{ cat $out; return 1; }}
    i=$((i + 1)); sleep 1
  done
  cat $out; return 1
}}
"""


# What an rdma_cm client (rping) says when nobody listens yet.
RDMA_CM_NOT_LISTENING = "\\|RDMA_CM_EVENT_REJECTED\\|RDMA_CM_EVENT_UNREACHABLE\\|CONNECTED state"


def rping_server(pings, port=7174):
    """Shell: an rping server that takes one connection of `pings` pings."""
    return f"timeout 200 rping -s -a 0.0.0.0 -p {port} -C {pings} -v"


def rping_client(pings, tries, port=7174):
    """Shell: rping to $VSTELLAR_PEER_IP, retried once a second (at most
    `tries` times) until the server listens; prints the last try's output."""
    return f"""\
i=0
until timeout 60 rping -c -a $VSTELLAR_PEER_IP -p {port} -C {pings} -v > /tmp/rping.out 2>&1; do
  i=$((i + 1)); [ $i -lt {tries} ] || {{ cat /tmp/rping.out; exit 1; }}
  sleep 1
done
cat /tmp/rping.out
"""


# The rping exchange of the device tests (tests/guest/test_vstellar.py) and
# the stock-guest tests, as an "== rping" section of each guest's output:
# the server takes one connection of RPING_PINGS pings and exits; the client
# retries until the server listens (bounded), like perftest's clients.
RPING_PINGS = 10
RPING_SERVER = "echo '== rping'\n" + rping_server(RPING_PINGS) + "\n"
RPING_CLIENT = "echo '== rping'\n" + rping_client(RPING_PINGS, 30)


# perftest exits at once when nobody listens yet; these are its words.
PERFTEST_NOT_LISTENING = ("Couldn't connect\\|Unable to perform rdma_client function"
                          "\\|Failed to connect")


def perftest_pair(tests, device, setup="", tries=60, common=""):
    """Server and client scripts that run each (tool, args) of tests in turn.

    tests: list of (tool, extra_args) such as ("ib_write_bw", "-s 65536 -n 200").
    Each tool runs on its own port so that a late client never meets the
    previous test's server. common: options for every tool, after -d and -p
    (VSTELLAR_COMMON selects the GID).
    """
    server = [setup, "set -e"]
    client = [setup, client_retry(PERFTEST_NOT_LISTENING, tries), "set -e"]
    for i, (tool, args) in enumerate(tests):
        port = 18515 + i
        server.append(f"echo '== {tool} {args}'")
        server.append(f"{tool} -d {device} -p {port} {common} {args}")
        client.append(f"echo '== {tool} {args}'")
        client.append(f"run_client {tool} -d {device} -p {port} {common} {args} $VSTELLAR_PEER_IP")
    return "\n".join(server) + "\n", "\n".join(client) + "\n"


# A vStellar guest against an rxe guest (plain RoCE v2; run_guests
# rxe_guests): guest INTEROP_VST has the vStellar device, guest INTEROP_RXE
# Soft-RoCE on its fabric NIC eth1. Path MTU 1024 on both sides must be
# asked for (-m 1024): rxe's over a 1500-byte Ethernet.
INTEROP_VST, INTEROP_RXE = 0, 1
RXE_COUNTERS = "/sys/class/infiniband/rxe0/ports/1/hw_counters"


def gid_index(dev, ip):
    """Shell: wait until DEV has the RoCE v2 GID of IPv4 address ip and
    export its index as GIDX."""
    a, b, c, d = (int(x) for x in ip.split("."))
    gid = f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"
    return f"""\
n=0
until GIDX=$(grep -l '^{gid}$' /sys/class/infiniband/{dev}/ports/1/gids/* 2>/dev/null | head -1); [ -n "$GIDX" ]; do
  n=$((n + 1)); [ $n -lt 100 ] || {{ echo "no GID {gid} on {dev}" >&2; cat /sys/class/infiniband/{dev}/ports/1/gids/* >&2; exit 1; }}
  sleep 0.1
done
GIDX=${{GIDX##*/}}
export GIDX
"""


def interop_script(me, dev, programs):
    """The commands of guest `me` (INTEROP_VST or INTEROP_RXE) of a
    vStellar-rxe pair (run_guests rxe_guests={INTEROP_RXE}): each
    (program, args) of `programs` with vStellar serving, then with rxe
    serving, on ports apart, each as a section "== PROG ARGS
    server=vstellar|rxe"; the TCP exchange over $VSTELLAR_OOB_PEER_IP.
    Programs that connect through rdma_cm (rping, perftest's -R) find the
    peer by its RoCE address, $VSTELLAR_PEER_IP, and choose the device and
    GID themselves. The rxe guest ends by printing its transport counters
    (== rxe counters)."""
    VST, RXE = INTEROP_VST, INTEROP_RXE
    lines = []
    if me == RXE:
        lines.append("rdma link add rxe0 type rxe netdev eth1 || exit 1")
    lines.append(gid_index(dev, guest_ip(me)))
    lines.append(client_retry(PERFTEST_NOT_LISTENING + RDMA_CM_NOT_LISTENING, 60))
    lines.append("set -e")
    for k, (prog, args) in enumerate(programs):
        port = 18515 + 2 * k
        for serving in (VST, RXE):
            lines.append(f"echo '== {prog} {args} server={'vstellar' if serving == VST else 'rxe'}'")
            if prog == "rping":
                server = f"rping -s -a 0.0.0.0 -p {port + serving} {args}"
                client = f"rping -c -a $VSTELLAR_PEER_IP -p {port + serving} {args}"
            elif " -R" in f" {args}":
                server = f"{prog} -d {dev} -p {port + serving} {args}"
                client = f"{server} $VSTELLAR_PEER_IP"
            else:
                gid = "-g $GIDX" if prog.startswith("ibv_") else "-x $GIDX"
                server = f"{prog} -d {dev} -p {port + serving} {gid} {args}"
                client = f"{server} $VSTELLAR_OOB_PEER_IP"
            # A bound on each run, so that a failure on one side ends the other.
            lines.append(f"timeout 180 {server}" if serving == me else f"run_client timeout 180 {client}")
    if me == RXE:
        lines.append(f"echo '== rxe counters'; cd {RXE_COUNTERS} && grep . *")
    return "\n".join(lines) + "\n"


def interop_pair(programs):
    """The commands of both guests of a vStellar-rxe pair, in guest order."""
    return (interop_script(INTEROP_VST, VSTELLAR_DEVICE, programs),
            interop_script(INTEROP_RXE, "rxe0", programs))


def sections_in_order(lines):
    """[(header, [lines])] from output with '== tool args' headers, in order
    (a test repeated with the same arguments gives one entry per run)."""
    sections = []
    for line in lines:
        if line.startswith("== "):
            sections.append((line[3:].strip(), []))
        elif sections:
            sections[-1][1].append(line)
    return sections


def split_sections(lines):
    """{'ib_write_bw -s ...': [lines]}: the last run of each header."""
    return dict(sections_in_order(lines))


_NUM = r"[-+]?\d+(?:\.\d+)?"


def parse_bw(lines):
    """Rows of an ib_*_bw report: bytes, iterations, peak and average Gb/s, Mpps."""
    rows = []
    header = False
    for line in lines:
        if re.search(r"#bytes\s+#iterations\s+BW peak", line):
            header = True
            continue
        m = re.match(rf"^\s*(\d+)\s+(\d+)\s+({_NUM})\s+({_NUM})\s+({_NUM})\s*$", line)
        if header and m:
            rows.append({"bytes": int(m.group(1)), "iterations": int(m.group(2)),
                         "bw_peak_gbps": float(m.group(3)), "bw_avg_gbps": float(m.group(4)),
                         "msg_rate_mpps": float(m.group(5))})
    return rows


# perftest's get_cpu_mhz() gives 0 when its calibration of the cycle counter
# against gettimeofday() correlates below r^2 = 0.9, which a TCG guest on a
# busy host can cause (it is descheduled between the samples); perftest then
# prints every rate of that run as 0.00 and says so on stderr with this line.
CLOCK_UNCALIBRATED = "Correlation coefficient r^2"


def clock_uncalibrated(lines):
    """Whether perftest said its rates in these lines are meaningless."""
    return any(CLOCK_UNCALIBRATED in line for line in lines)


def check_rate(test, value, lines):
    """Assert that a rate perftest printed is positive, unless perftest said its
    clock calibration failed: then the rate is 0.00 whatever the device did,
    and the run's other checks (exit status, bytes, iterations) stand alone."""
    if clock_uncalibrated(lines):
        test.assertEqual(value, 0.0, "\n".join(lines))
    else:
        test.assertGreater(value, 0.0, "\n".join(lines))


def parse_lat(lines):
    """Rows of an ib_*_lat report, in microseconds."""
    rows = []
    header = False
    names = ["t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p99_9"]
    for line in lines:
        if re.search(r"#bytes\s+#iterations\s+t_min", line):
            header = True
            continue
        parts = line.split()
        # inf/nan: what a run whose clock calibration failed prints (CLOCK_UNCALIBRATED)
        if header and len(parts) == 9 and all(re.fullmatch(rf"{_NUM}|-?inf|-?nan", p) for p in parts):
            row = {"bytes": int(parts[0]), "iterations": int(parts[1])}
            row.update({f"{n}_us": float(v) for n, v in zip(names, parts[2:])})
            rows.append(row)
    return rows
