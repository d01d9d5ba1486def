"""Live migration of a guest whose RDMA keeps running (docs/running-guests.md,
"Live migration").

Three hosts or more (network namespaces, guest.TestNet with the daemons'
fabric network): host 0 runs guest 0 and its vstellard; hosts 1 and 2 each
run a vstellard that may serve guest 1's address, which starts on host 1;
one more host may serve guest 0's, so that both can move. To migrate it, a destination QEMU starts on the
other host (-incoming, paused), the source QEMU migrates into it over a
unix socket, and once QEMU reports the migration complete the guest's
address moves with it, as a fabric would route it to its new host: it
leaves the source host's fabric interface, joins the destination's, and
the peer host forgets its ARP entry. Then the destination runs the guest
on. The RDMA state goes in QEMU's migration stream (the device's
vhost-user state transfer, docs/virtio-vstellar.md).
"""
import os
import shutil
import subprocess
import tempfile
import time

from . import guest as vg


def _ns(netns, *cmd):
    r = subprocess.run(["ip", "netns", "exec", netns] + list(cmd), capture_output=True, text=True)
    if r.returncode:
        raise vg.GuestError(f"`{' '.join(cmd)}` in {netns}: {r.stderr.strip()}")


def move_address(net, addrs, src, dst, peers):
    """The fabric now routes addrs (a list of A.B.C.D/LEN, the first one
    the interface's primary address in its subnet) to host dst: they leave
    host src's fabric interface for host dst's, and the peers forget where
    they were. The others go first: deleting a primary address deletes
    the secondary ones of its subnet with it."""
    for a in reversed(addrs):
        _ns(net.hosts[src], "ip", "addr", "del", a, "dev", "fab")
    for a in addrs:
        _ns(net.hosts[dst], "ip", "addr", "add", a, "dev", "fab")
    for p in peers:
        _ns(net.hosts[p], "ip", "neigh", "flush", "dev", "fab")


def migrate(qmp, uri, timeout=300):
    """Migrate the guest behind qmp to uri; returns query-migrate's last
    answer (status "completed", "failed" or "cancelled")."""
    qmp.execute("migrate", uri=uri)
    deadline = time.monotonic() + timeout
    while True:
        info = qmp.execute("query-migrate")
        if info.get("status") in ("completed", "failed", "cancelled"):
            return info
        if time.monotonic() > deadline:
            qmp.execute("migrate_cancel")
            raise vg.GuestError(f"migration did not finish within {timeout} s: {info}")
        time.sleep(0.02)


# A device hot-plugged into guest 1 (run_migration's plug): its QMP id and
# PCI slot. A migration's destination QEMU must have the same devices at
# the same addresses, so each one of guest 1's gets it on its command line.
PLUG_ID = "vst1"
PLUG_SLOT = "0x10"
# Its address: a device needs one of its own (the daemon finds a packet's
# device by the address it is sent to), which guest 1 adds to its eth0
# and which moves with it as its first one does.
PLUG_IP = "10.77.0.102"


def run_migration(commands, trigger, plan=(2, 1), mem=1024, timeout=600, echo=None, vstellard_args=(),
                  refusing_args=None, peer_host=False, image=None, daemons_out=None, migrations_out=None,
                  plug=None, after_each=None, finish=None):
    """Boot two guests with vStellar (guest 0 from host 0, guest 1 from
    host 1), each running its command; once a line of guest 1's output
    starts with `trigger`, migrate guests as `plan` says, one after the
    other, then wait for both commands.

    plan: a list of hosts to move guest 1 to in turn, or of (guest, host).
    Hosts 1 and 2 serve guest 1's address; host 3, when refusing_args is
    given, runs a daemon with those arguments that must refuse the state
    (the migration fails and the guest runs on where it was); with
    peer_host, one more host (the last) serves guest 0's address, so that
    guest 0 can move too. image: a guest image other than the test image
    (an overlay_image variant). plug: once a line of guest 1's output
    starts with it, a second vStellar device is hot-plugged into guest 1
    (id PLUG_ID in slot PLUG_SLOT), served by the same daemon as its
    first, for the address PLUG_IP (the guest's command adds it to eth0);
    from then on guest 1 migrates with both. after_each(record, daemons):
    called after each migration (its source QEMU gone), e.g. to take the
    daemons' footprint. finish: a line typed into guest 1's console once
    the plan is done (its command reads /dev/ttyS0 to know when to stop).

    Returns run_guests' list of (status, output, console); each guest's
    output is its whole command's, across its QEMUs. migrations_out
    receives one dict per migration: the guest, its status, QEMU's
    downtime, setup and total time (ms), how long moving the address took,
    and both guests' output up to the migration's end ("output").
    """
    if len(commands) != 2:
        raise vg.GuestError("run_migration takes two commands: guest 0's and guest 1's")
    art = vg.Artifacts(image=image)
    modules = list(vg.VSTELLAR_MODULES)
    ips = [vg.guest_ip(i) for i in range(2)]
    addrs = [f"{ip}/24" for ip in ips]
    plan = [(1, p) if isinstance(p, int) else tuple(p) for p in plan]
    tmp = tempfile.mkdtemp(prefix="vstellar-migration-")
    with vg.Session() as s:
        try:
            hosts = 4 if refusing_args is not None else 3
            if peer_host:
                hosts += 1
            serves = [1] * hosts  # the guest whose address each host's daemon may hold
            serves[0] = 0
            if peer_host:
                serves[-1] = 0
            guest1_addrs = [addrs[1]] + ([f"{PLUG_IP}/24"] if plug else [])
            fab = [[addrs[0]], guest1_addrs] + [[]] * (hosts - 2)
            s.net = vg.TestNet(hosts, fabric=True, fab_addrs=fab)
            s.net.create()
            daemons = []
            for h in range(hosts):
                ip = ips[serves[h]]
                refusing = refusing_args is not None and h == 3
                args = list(vstellard_args) + (list(refusing_args) if refusing else [])
                devices = [[ip]] + ([[PLUG_IP]] if plug and serves[h] == 1 else [])
                d = vg.Vstellard(art, f"host{h}", netns=s.net.hosts[h], ip=ip, args=args, devices=devices)
                d.guests = [serves[h]]
                s.daemons.append(d)
                daemons.append(d)
                d.start()
            prologues = [f"export VSTELLAR_INDEX={i} VSTELLAR_SELF_IP={ips[i]} VSTELLAR_PEER_IP={ips[1 - i]}\n"
                         for i in range(2)]
            moving = {g for g, _h in plan} | ({1} if plug else set())
            current, incarnations, where = [], [], [0, 1]
            for i, cmd in enumerate(commands):
                g = vg.Guest(art, f"guest{i}", prologues[i] + cmd, netns=s.net.hosts[i], index=i, mem=mem,
                             modules=modules, qemu_args=daemons[i].qemu_args(mem), timeout=timeout,
                             echo=echo, qmp=(i in moving), console_input=bool(finish) and i == 1)
                s.guests.append(g)
                current.append(g)
                incarnations.append([g])
                g.start()
            deadline = time.monotonic() + timeout

            def wait_line(prefix):
                while not any(line.startswith(prefix) for line in current[1].output):
                    if current[1].proc.poll() is not None or time.monotonic() > deadline:
                        raise vg.GuestError(f"guest1 never printed {prefix!r}:\n" +
                                            "\n".join(current[1].console[-40:]))
                    time.sleep(0.1)

            plugged = False  # guest 1 has the hot-plugged device
            if plug:
                wait_line(plug)
                vg.plug_vstellar(current[1].connect(), daemons[1].socks[1], PLUG_ID, addr=PLUG_SLOT)
                plugged = True
            wait_line(trigger)

            def output(i):
                return [line for g in incarnations[i] for line in g.output]

            for r, (gi, dst) in enumerate(plan):
                mover = current[gi]
                host = where[gi]
                uri = f"unix:{os.path.join(tmp, f'migrate{r}.sock')}"
                qemu_args = daemons[dst].qemu_args(mem)
                if gi == 1 and plugged:
                    qemu_args += vg.vstellar_device_args(daemons[dst].socks[1], PLUG_ID, addr=PLUG_SLOT)
                new = vg.Guest(art, f"guest{gi}", prologues[gi] + commands[gi], netns=s.net.hosts[dst], index=gi,
                               mem=mem, modules=modules, qemu_args=qemu_args, timeout=timeout,
                               echo=echo, qmp=True, incoming=uri, console_input=bool(finish) and gi == 1)
                s.guests.append(new)
                new.start()
                # The return path: a destination that cannot load the state
                # (its vstellard refuses it) tells the source, whose
                # migration then fails and whose guest runs on; without
                # it, the source would call the migration complete.
                rp = [{"capability": "return-path", "state": True}]
                new.connect().execute("migrate-set-capabilities", capabilities=rp)
                mover.connect().execute("migrate-set-capabilities", capabilities=rp)
                # QEMU 7.2 copies at 32 MiB/s by default: a 1 GiB guest
                # would take half a minute; here the "network" is a socket.
                mover.connect().execute("migrate-set-parameters", **{"max-bandwidth": 8 << 30})
                try:
                    info = migrate(mover.connect(), uri)
                except (OSError, vg.GuestError) as e:
                    raise vg.GuestError(f"migration {r} failed ({e}); the source's console:\n" +
                                        "\n".join(mover.console[-20:]) + "\nthe destination's:\n" +
                                        "\n".join(new.console[-20:]))
                record = {"round": r, "guest": gi, "from": host, "to": dst, "status": info.get("status"),
                          "downtime_ms": info.get("downtime"), "total_ms": info.get("total-time"),
                          "setup_ms": info.get("setup-time"), "ram": info.get("ram", {})}
                if migrations_out is not None:
                    migrations_out.append(record)
                if info.get("status") != "completed":
                    # The guest runs on where it was; the destination goes.
                    new.kill()
                    record["error"] = info.get("error-desc")
                    record["output"] = [output(0), output(1)]
                    if after_each:
                        after_each(record, daemons)
                    continue
                t0 = time.monotonic()
                move_address(s.net, guest1_addrs if gi == 1 else [addrs[0]], host, dst, peers=[where[1 - gi]])
                try:
                    new.connect().execute("cont")
                except (OSError, vg.GuestError) as e:
                    new.kill()
                    raise vg.GuestError(f"the destination QEMU did not go on ({e}):\n" +
                                        "\n".join(new.console[-30:]) + "\n" + daemons[dst].text()[-2000:])
                record["address_ms"] = round((time.monotonic() - t0) * 1000, 1)
                # The source QEMU has handed the guest over: it may go.
                mover.connect().execute("quit")
                mover.wait()
                current[gi] = new
                incarnations[gi].append(new)
                where[gi] = dst
                record["output"] = [output(0), output(1)]
                if after_each:
                    after_each(record, daemons)
            if finish:
                current[1].type_line(finish)
            results = []
            for i in range(2):
                status = current[i].wait()
                console = [line for g in incarnations[i] for line in g.console]
                results.append((status, output(i), console))
            return results
        finally:
            for d in s.daemons:
                d.stop()
            if daemons_out is not None:
                daemons_out.extend({"stats": d.stats, "log": d.log_text, "guests": d.guests} for d in s.daemons)
            shutil.rmtree(tmp, ignore_errors=True)
