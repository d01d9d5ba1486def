"""Shell snippets for the RDMA users that the guest tests and the guest
soak (tools/soak/guest-soak) both run inside guests: the kernel's NVMe-oF
target and host (nvmet-rdma, nvme-rdma) and OpenMPI over UCX.
"""

NQN = "nqn.2026-12.org.vstellar:nvme"

# A memory-backed null_blk disk for the target to export (/dev/nullb0).
NULL_BLK = "modprobe null_blk nr_devices=1 gb=1 memory_backed=1\n"

# Target helpers: `nvmet_up ADDR PORT` exports /dev/nullb0 as NQN on
# ADDR:PORT over RDMA, nvmet_down takes it down again (the kernel refuses
# to drop a port or subsystem that is still linked, so the order matters).
NVMET = f"""\
nvmet_up() {{
  c=/sys/kernel/config/nvmet
  grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs configfs /sys/kernel/config
  mkdir -p $c/subsystems/{NQN}/namespaces/1 $c/ports/1 || return 1
  echo 1 > $c/subsystems/{NQN}/attr_allow_any_host
  echo /dev/nullb0 > $c/subsystems/{NQN}/namespaces/1/device_path
  echo 1 > $c/subsystems/{NQN}/namespaces/1/enable || return 1
  echo rdma > $c/ports/1/addr_trtype
  echo ipv4 > $c/ports/1/addr_adrfam
  echo "$1" > $c/ports/1/addr_traddr
  echo "$2" > $c/ports/1/addr_trsvcid
  ln -s $c/subsystems/{NQN} $c/ports/1/subsystems/{NQN} || return 1
}}
nvmet_down() {{
  c=/sys/kernel/config/nvmet
  rm -f $c/ports/1/subsystems/{NQN}
  rmdir $c/ports/1
  echo 0 > $c/subsystems/{NQN}/namespaces/1/enable
  rmdir $c/subsystems/{NQN}/namespaces/1 $c/subsystems/{NQN}
}}
"""

# Host helper: `nvme_attach ADDR PORT` connects (retried while the target
# does not listen yet) and waits for the namespace, left in $dev.
NVME_ATTACH = f"""\
nvme_attach() {{
  i=0
  until nvme connect -t rdma -a "$1" -s "$2" -n {NQN} > /tmp/connect.out 2>&1; do
    i=$((i + 1)); [ $i -lt 60 ] || {{ cat /tmp/connect.out; return 1; }}
    sleep 1
  done
  cat /tmp/connect.out
  dev=
  i=0
  while [ -z "$dev" ]; do
    for d in /sys/class/nvme/nvme*; do
      [ "$(cat $d/subsysnqn 2>/dev/null)" = "{NQN}" ] && [ "$(cat $d/transport)" = rdma ] &&
        [ -b /dev/${{d##*/}}n1 ] && dev=/dev/${{d##*/}}n1
    done
    i=$((i + 1)); [ -n "$dev" ] || [ $i -lt 100 ] || {{ echo "no namespace"; return 1; }}
    [ -n "$dev" ] || sleep 0.1
  done
  echo "namespace $dev"
}}
"""

# OpenMPI between this guest and $VSTELLAR_PEER_IP (whose dropbear
# `vstellar-mpi serve` runs). Settings a user needs, and why: `--mca pml
# ucx`, because OpenMPI 4.1 picks UCX by itself only for devices whose name
# matches opal_common_ucx_devices (mlx*); `-x UCX_NET_DEVICES=vstellar0:1`,
# so UCX uses the RDMA device and not its TCP transport on eth0; the TCP
# BTL is excluded (`--mca btl self`), so no MPI data can take it.
MPIRUN = ("mpirun -np 2 --host $VSTELLAR_SELF_IP,$VSTELLAR_PEER_IP "
          "--mca pml ucx --mca btl self -x UCX_NET_DEVICES=vstellar0:1")
