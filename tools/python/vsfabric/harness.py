"""Run vstellar-harness server/client pairs across a Fabric.

Each pair k gets its own ports, so every connection has its own set of UDP
source ports (the harness shares one socket per path among the QPs of a
process, so "C connections of k paths" means C harness pairs):
  server base port 10000 + 512k, client base port 38000 + 512k, control 9000 + k.
Path i of the client sends from port (client base + i) to the server's base
port; ACKs come back from (server base + i). family=6 runs the pairs over the
fabric's IPv6 addresses (a Fabric built with ipv6=True): data, ACKs and the
control connection are then IPv6.
"""
import json
import os
import subprocess
import time

MAX_PAIRS = 50


def harness_binary():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.abspath(os.path.join(here, "..", "..", ".."))
    build = os.environ.get("BUILD_DIR", os.path.join(repo, "build"))
    if not os.path.isabs(build):
        build = os.path.join(repo, build)
    h = os.path.join(build, "qemu-device/harness/vstellar-harness")
    if not os.access(h, os.X_OK):
        raise SystemExit(f"vsfabric: {h} is missing: build it with "
                         f"ninja -C {build} vstellar-harness")
    return h


def ports(k):
    if k >= MAX_PAIRS:
        raise ValueError("too many pairs")
    return 10000 + 512 * k, 38000 + 512 * k, 9000 + k


def run_pairs(fab, pairs, args, duration, during=None, timeout=None, family=4):
    """pairs: [((src_tor, src_host), (dst_tor, dst_host))]; the client runs on
    src and WRITEs to dst. args: harness options for both ends (transport) and
    the client (workload). during(t_start): called once all clients started,
    in this thread, while they run. family: 4 or 6, the IP version of the
    hosts' addresses the pairs use. Returns a list of dicts per pair:
    {client, server, rc, t_start (wall), t_exit (wall), stderr}."""
    h = harness_binary()
    args = [str(a) for a in args]
    servers, clients = [], []
    for k, (src, dst) in enumerate(pairs):
        sp, cp, ctl = ports(k)
        sip, cip = fab.host_addr(*dst, family), fab.host_addr(*src, family)
        servers.append(fab.popen(fab.host(*dst), [
            h, "--role", "server", "--local-ip", sip, "--peer-ip", cip, "--base-port", sp,
            "--peer-port", cp, "--ctrl-port", ctl] + args))
    time.sleep(0.05)
    starts = []
    for k, (src, dst) in enumerate(pairs):
        sp, cp, ctl = ports(k)
        sip, cip = fab.host_addr(*dst, family), fab.host_addr(*src, family)
        starts.append(time.time())
        clients.append(fab.popen(fab.host(*src), [
            h, "--role", "client", "--local-ip", cip, "--peer-ip", sip, "--base-port", cp,
            "--peer-port", sp, "--ctrl-port", ctl, "--duration", duration] + args))
    t_start = time.time()
    if during:
        during(t_start)
    limit = time.time() + (timeout or (float(duration) + 30 + 2 * len(pairs)))
    out = []
    exits = [None] * len(clients)
    while any(c.poll() is None for c in clients) and time.time() < limit:
        for i, c in enumerate(clients):
            if exits[i] is None and c.poll() is not None:
                exits[i] = time.time()
        time.sleep(0.01)
    for i, c in enumerate(clients):
        if exits[i] is None and c.poll() is not None:
            exits[i] = time.time()
    for i, (c, s) in enumerate(zip(clients, servers)):
        rec = {"pair": i, "src": pairs[i][0], "dst": pairs[i][1], "t_start": starts[i],
               "t_exit": exits[i]}
        for role, p in (("client", c), ("server", s)):
            try:
                o, e = p.communicate(timeout=max(1, limit - time.time()) if role == "client" else 5)
            except subprocess.TimeoutExpired:
                p.kill()
                o, e = p.communicate()
            rec[role + "_rc"] = p.returncode
            rec[role + "_stderr"] = (e or "").strip()[-int(os.environ.get("VSF_STDERR_TAIL", 500)):]
            try:
                rec[role] = json.loads(o) if o.strip() else None
            except json.JSONDecodeError:
                rec[role] = None
        out.append(rec)
    fab.kill_procs()
    return out


def summarize(results):
    """Totals over pairs: goodput, retransmissions, timeouts, failed messages,
    and whether every posted WR completed; and each engine counter summed
    over the clients (`engine`) and the servers (`server_engine`), which
    tell what the losses were (timeouts, spurious ones, overdue, path gaps)
    and how many packets arrived twice (the servers' dup_pkts)."""
    g = retx = tmo = err = posted = done = 0
    ok = True
    bad = []
    sums = {"client": {}, "server": {}}
    for r in results:
        for role, total in sums.items():
            eng = (r.get(role) or {}).get("engine") or {}
            for k, v in eng.items():
                if isinstance(v, int) and not isinstance(v, bool):
                    total[k] = total.get(k, 0) + v
    for r in results:
        c = r.get("client")
        if not c or r.get("client_rc") not in (0, 3):
            ok = False
            bad.append({"pair": r["pair"], "client_rc": r.get("client_rc"),
                        "client_stderr": r.get("client_stderr"),
                        "server_rc": r.get("server_rc"), "server_stderr": r.get("server_stderr")})
            continue
        g += c.get("goodput_gbps", 0)
        err += c.get("errors", 0)
        posted += c.get("posted", 0)
        done += c.get("completed", 0)
        retx += c["engine"].get("retx_pkts", 0)
        tmo += c["engine"].get("timeouts", 0)
    return {"goodput_gbps": round(g, 4), "retx_pkts": retx, "timeouts": tmo,
            "failed_messages": err, "posted": posted, "completed": done,
            "all_completed": ok and posted == done and err == 0, "all_clients_ok": ok,
            "client_failures": bad, "engine": sums["client"], "server_engine": sums["server"]}


def route_dev(fab, ns, pairs_ports, src_ip, dst_ip):
    """Which device the ECMP route in ns picks for each (sport, dport):
    `ip route get ... ipproto udp sport S dport D`, batched. The addresses
    may be IPv4 or IPv6 (ip takes the family from them)."""
    # Asked as a packet forwarded from the first host port (iif d0).
    cmds = "".join(f"route get {dst_ip} from {src_ip} iif d0 ipproto udp sport {s} dport {d}\n"
                   for s, d in pairs_ports)
    p = subprocess.run(["ip", "-n", ns, "-o", "-batch", "-"], input=cmds, capture_output=True,
                       text=True)
    devs = []
    for line in p.stdout.splitlines():
        parts = line.split()
        if "dev" in parts:
            devs.append(parts[parts.index("dev") + 1])
    if len(devs) != len(pairs_ports):
        raise RuntimeError(f"ip route get: {p.stderr.strip()[:300]}")
    return devs
