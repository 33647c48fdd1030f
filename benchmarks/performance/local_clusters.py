r"""Real Ray and SLURM clusters on this machine, on loopback only, for the executors' tests
and benchmark.

  python benchmarks/performance/local_clusters.py ray --folder=/tmp/ray_here     # prints the address
  python benchmarks/performance/local_clusters.py slurm --folder=/tmp/slurm_here # prints SLURM_CONF

Every cluster lives in a network namespace of its own whose only interface is ``lo``
(:func:`start_loopback`: ``unshare --net`` as root), and so does every command that talks to
it (:meth:`Loopback.wrap`: ``nsenter --net``): no packet can leave the machine's loopback.
Without the namespace Ray would not stay there: ``ray start --node-ip-address=127.0.0.1``
goes through Ray's ``resolve_ip_for_localhost``, which on Linux turns 127.0.0.1 into the
machine's outward-facing address, and the nodes then register and talk at that address. In
the namespace there is none, so Ray finds only 127.0.0.1.

Ray: a head node and more nodes, each its own ``ray start --block`` process (its own process
group, so a test can kill a node outright, or only its raylet). SLURM: munge, slurmctld and
slurmd from the distribution's packages (Debian: ``apt-get install slurm-wlm munge``),
configured in ``folder`` for this one machine (run as root; no cgroups, no accounting), its
clients pointed at it by ``SLURM_CONF``. Each ``start_*`` returns a handle whose ``stop()``
ends what it started; each raises :class:`Unavailable` with the reason where it cannot start
(a test then skips with it). The command-line form starts one and keeps it until Ctrl-C, to
try docs/cluster.md on one machine; it prints the ``nsenter`` prefix the sweep needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


class Unavailable(RuntimeError):
  """A cluster that cannot start here, and why."""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _ray_bin() -> str:
  path = os.path.join(os.path.dirname(sys.executable), 'ray')
  if not os.path.exists(path):
    raise Unavailable("Ray is not installed in this Python (pip install 'fedjax_kd[ray]')")
  return path


def _wait(predicate, timeout: float, what: str, log: str = '') -> None:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return
    time.sleep(0.5)
  tail = ''
  if log and os.path.exists(log):
    with open(log, errors='replace') as f:
      tail = ' '.join(f.read().split())[-600:]
  raise Unavailable(f'{what} did not come up in {timeout:.0f} s' + (f': {tail}' if tail else ''))


# Run in the new namespaces: brings ``lo`` up (SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP)
# and gives it a second loopback address, 127.0.0.2 (SIOCSIFADDR on ``lo:1``): glibc's
# getaddrinfo with AI_ADDRCONFIG, which SLURM's daemons call to bind, finds no IPv4 address
# where 127.0.0.1 is the only one. Then it says so and holds the namespaces open until its
# stdin closes (the process that made them let go, or died).
_HOLD_LOOPBACK = r"""
import fcntl, socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
flags = struct.unpack_from('H', fcntl.ioctl(s, 0x8913, struct.pack('16s24x', b'lo')), 16)[0]
fcntl.ioctl(s, 0x8914, struct.pack('16sH22x', b'lo', flags | 1))
fcntl.ioctl(s, 0x8916, struct.pack('16sHH4s16x', b'lo:1', socket.AF_INET, 0,
                                   socket.inet_aton('127.0.0.2')))
print('up', flush=True)
sys.stdin.read()
"""


@dataclasses.dataclass
class Loopback:
  """A network namespace whose only interface is ``lo`` (up), held open by one process.

  It comes with a mount namespace in which ``/etc/hosts`` names this machine 127.0.0.1:
  where Ray cannot find an outward-facing address it falls back to the machine's name, which
  outside may mean an address the namespace does not have. The processes of a cluster, and
  every command that talks to one, start in both through :meth:`wrap`; their children stay
  there. The namespaces last while any process is in them.
  """
  holder: subprocess.Popen
  hosts: str   # the /etc/hosts of the namespace (a file of ours, bound over it)

  def wrap(self, argv: list[str], cwd: str | None = None) -> list[str]:
    """``argv`` run in the namespaces, in the folder ``cwd`` (default: this process's)."""
    pid = self.holder.pid
    return ['nsenter', f'--net=/proc/{pid}/ns/net', f'--mount=/proc/{pid}/ns/mnt',
            f'--wd={os.path.abspath(cwd or os.getcwd())}', '--', *argv]

  def shell_prefix(self) -> str:
    """What to type before a command to run it in the namespaces, in the shell's folder."""
    return ' '.join(self.wrap([], '/')[:-2]) + ' --wd="$PWD" --'

  def interfaces(self) -> list[str]:
    """The names of the namespace's network interfaces (the kernel's ``net/dev`` of it)."""
    with open(f'/proc/{self.holder.pid}/net/dev') as f:
      return [line.split(':')[0].strip() for line in f.read().splitlines()[2:] if ':' in line]

  def stop(self) -> None:
    """Lets go of the namespaces (they go once the processes in them have ended)."""
    if self.holder.poll() is None:
      try:
        self.holder.stdin.close()
      except OSError:
        pass
      try:
        self.holder.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.holder.kill()
        self.holder.wait()
    try:
      os.remove(self.hosts)
    except OSError:
      pass


def start_loopback() -> Loopback:
  """New network and mount namespaces: only ``lo`` (up), and an ``/etc/hosts`` that names this
  machine 127.0.0.1.

  Raises:
    Unavailable: not root, ``unshare``/``nsenter`` missing, or the kernel refused.
  """
  missing = [b for b in ('unshare', 'nsenter') if shutil.which(b) is None]
  if missing:
    raise Unavailable(f'{" and ".join(missing)} not found (util-linux): the clusters run in '
                      'a network namespace with only lo, so that nothing leaves loopback')
  if os.geteuid() != 0:
    raise Unavailable('a network namespace with only lo needs root (unshare --net), so that '
                      'nothing leaves loopback; this user is not root')
  fd, hosts = tempfile.mkstemp(prefix='fedjax_kd_hosts_')
  names = ' '.join(dict.fromkeys([socket.getfqdn(), socket.gethostname().split('.')[0]]))
  with os.fdopen(fd, 'w') as f:
    f.write(f'127.0.0.1\tlocalhost {names}\n::1\tlocalhost ip6-localhost ip6-loopback\n')
  os.chmod(hosts, 0o644)
  holder = subprocess.Popen(
      ['unshare', '--net', '--mount', '--propagation', 'private', '--', 'sh', '-c',
       'mount --bind "$0" /etc/hosts && exec "$@"', hosts, sys.executable, '-c',
       _HOLD_LOOPBACK], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, start_new_session=True)
  line = holder.stdout.readline().strip()
  net = Loopback(holder, hosts)
  if line != 'up':
    holder.kill()
    err = ' '.join(holder.communicate()[1].split())[-400:]
    net.stop()
    raise Unavailable(f'no network namespace with only lo (unshare --net --mount): '
                      f'{err or line or "no answer"}')
  if net.interfaces() != ['lo']:
    found = net.interfaces()
    net.stop()
    raise Unavailable(f'the new network namespace holds {found}, not only lo')
  return net


@dataclasses.dataclass
class RayCluster:
  """A head and worker nodes, each a ``ray start --block`` process group, all in the network
  namespace :attr:`net` (only ``lo``)."""
  address: str
  folder: str
  net: Loopback
  nodes: list[subprocess.Popen]
  cpus: int = 1
  timeout: float = 120.0
  ids: list[str] = dataclasses.field(default_factory=list)   # each node's Ray node id

  def wrap(self, argv: list[str], cwd: str | None = None) -> list[str]:
    """``argv`` run where it reaches the cluster: in its namespaces (:meth:`Loopback.wrap`)."""
    return self.net.wrap(argv, cwd)

  def alive(self) -> dict[str, str]:
    """``{node id: its address}`` of the nodes the cluster lists as alive (none: no answer).
    By id, not by count: a node just killed stays listed until the cluster notices."""
    code = ('import json, ray\n'
            f'ray.init(address="{self.address}", logging_level="ERROR", log_to_driver=False)\n'
            'print(json.dumps({n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()\n'
            '                  if n["Alive"]}))\n')
    proc = subprocess.run(self.wrap([sys.executable, '-c', code]), capture_output=True,
                          text=True, check=False, timeout=120, env=_ray_env(self.folder))
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else {}

  def add_node(self, wrap: list[str] | None = None) -> int:
    """Starts one more node (under the command ``wrap``, e.g. ``unshare``, if given) and
    waits until the cluster lists it; returns its index in :attr:`nodes`.

    Raises:
      Unavailable: it did not come up.
    """
    k = len(self.nodes)
    before = set(self.alive())
    node_log = os.path.join(self.folder, f'node{k}.log')
    cmd = [_ray_bin(), 'start', f'--address={self.address}'] + _node_flags(self.cpus)
    with open(node_log, 'w') as log:
      self.nodes.append(subprocess.Popen(self.wrap((wrap or []) + cmd), stdout=log,
                                         stderr=subprocess.STDOUT, env=_ray_env(self.folder),
                                         start_new_session=True))
    new: set[str] = set()

    def joined() -> bool:
      new.update(set(self.alive()) - before)
      return bool(new)

    _wait(joined, self.timeout, f'Ray node {k}', node_log)
    self.ids.append(sorted(new)[0])
    return k

  def kill_node(self, k: int) -> None:
    """SIGKILL to node ``k``'s whole process group (its raylet and workers), and to every
    process that one of its workers started (a run's worker process), as if its machine
    were gone."""
    proc = self.nodes[k]
    victims = _descendants(proc.pid)
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
      pass
    for pid in victims:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    proc.wait()

  def kill_raylet(self, k: int) -> int:
    """SIGKILL to node ``k``'s raylet alone: its Ray workers, and the processes they started,
    are left running, as when a node's daemon crashes or is OOM-killed. Returns its pid.

    Raises:
      LookupError: node ``k`` has no raylet running.
    """
    for pid in _descendants(self.nodes[k].pid):
      try:
        with open(f'/proc/{pid}/comm') as f:
          name = f.read().strip()
      except OSError:
        continue
      if name == 'raylet':
        os.kill(pid, signal.SIGKILL)
        return pid
    raise LookupError(f'Ray node {k} has no raylet running')

  def stop(self) -> None:
    """Ends every node (SIGTERM to each process group, SIGKILL to what is left after 10 s),
    then lets go of the namespace."""
    groups = [p.pid for p in self.nodes]
    for pgid in reversed(groups):
      try:
        os.killpg(pgid, signal.SIGTERM)
      except OSError:
        pass
    deadline = time.monotonic() + 10
    for proc in self.nodes:
      try:
        proc.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        pass
    for pgid in groups:   # the group's other processes (GCS, raylet, workers)
      try:
        os.killpg(pgid, signal.SIGKILL)
      except OSError:
        pass
    for proc in self.nodes:
      proc.wait()
    self.net.stop()


def _descendants(pid: int) -> list[int]:
  """Every process below ``pid`` (from /proc: children of children, in any session)."""
  children: dict[int, list[int]] = {}
  for name in os.listdir('/proc'):
    if not name.isdigit():
      continue
    try:
      with open(f'/proc/{name}/stat') as f:
        ppid = int(f.read().rsplit(')', 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
      continue
    children.setdefault(ppid, []).append(int(name))
  out, todo = [], [pid]
  while todo:
    for c in children.get(todo.pop(), []):
      out.append(c)
      todo.append(c)
  return out


def _ray_env(folder: str) -> dict[str, str]:
  env = dict(os.environ)
  env['RAY_USAGE_STATS_ENABLED'] = '0'
  env['RAY_TMPDIR'] = folder
  return env


def _node_flags(cpus: int) -> list[str]:
  return ['--block', '--node-ip-address=127.0.0.1', f'--num-cpus={cpus}', '--num-gpus=0',
          '--disable-usage-stats']


# The longest folder a Ray node's sockets fit under: Ray puts them at the longest as below
# (a session's date, time, microseconds and a 7-digit process id), and a Unix socket's path has
# at most 107 bytes.
UNIX_SOCKET_PATH_MAX = 107
RAY_SOCKET_TAIL = '/session_2026-12-06_10-48-19_595632_4194304/sockets/plasma_store.1'
RAY_FOLDER_MAX = UNIX_SOCKET_PATH_MAX - len(RAY_SOCKET_TAIL)


def start_ray(folder: str, nodes: int = 2, cpus: int = 1, timeout: float = 120.0
              ) -> RayCluster:
  """A Ray cluster of ``nodes`` nodes with ``cpus`` CPUs each on 127.0.0.1, in a network
  namespace of its own with only ``lo`` (:func:`start_loopback`).

  Args:
    folder: Ray's temporary folder (sessions, logs), at most :data:`RAY_FOLDER_MAX` characters
      (its sockets live under it).
    nodes: the head and ``nodes - 1`` more (:meth:`RayCluster.add_node` adds others).
    cpus: each node's CPUs.
    timeout: seconds for each node to show in the cluster.

  Raises:
    ValueError: ``folder`` too long for the sockets under it.
    Unavailable: Ray missing, no namespace, a node did not come up, or a node registered at
      an address other than 127.0.0.1.
  """
  folder = os.path.abspath(folder)
  if len(folder) > RAY_FOLDER_MAX:
    raise ValueError(
        f"Ray's folder {folder} is {len(folder)} characters: its nodes' socket paths under it "
        f'would pass the {UNIX_SOCKET_PATH_MAX} bytes a Unix socket path allows; give one of at '
        f'most {RAY_FOLDER_MAX} (tempfile.mkdtemp(dir="/tmp"))')
  ray = _ray_bin()
  os.makedirs(folder, exist_ok=True)
  net = start_loopback()
  port = free_port()
  address = f'127.0.0.1:{port}'
  head_log = os.path.join(folder, 'head.log')
  with open(head_log, 'w') as log:
    head = subprocess.Popen(
        net.wrap([ray, 'start', '--head', f'--port={port}', '--include-dashboard=false',
                  f'--temp-dir={folder}'] + _node_flags(cpus)), stdout=log,
        stderr=subprocess.STDOUT, env=_ray_env(folder), start_new_session=True)
  cluster = RayCluster(address, folder, net, [head], cpus, timeout)
  try:
    _wait(lambda: bool(cluster.alive()), timeout, 'the Ray head', head_log)
    cluster.ids.append(sorted(cluster.alive())[0])
    for _ in range(1, nodes):
      cluster.add_node()
    elsewhere = {i: a for i, a in cluster.alive().items() if a != '127.0.0.1'}
    if elsewhere:
      raise Unavailable(f'Ray nodes registered away from 127.0.0.1: {elsewhere}')
  except Unavailable:
    cluster.stop()
    raise
  return cluster


SLURM_CONF = '''ClusterName=fedjaxkd
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
AuthInfo=socket={folder}/munge.sock
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
ReturnToService=2
KillWait=60
MinJobAge=600
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
'''


@dataclasses.dataclass
class SlurmCluster:
  """munged, slurmctld and slurmd in the foreground in the network namespace :attr:`net`
  (only ``lo``), and the ``SLURM_CONF`` for clients."""
  conf: str
  folder: str
  net: Loopback
  procs: list[subprocess.Popen]

  def env(self) -> dict[str, str]:
    return {**os.environ, 'SLURM_CONF': self.conf}

  def wrap(self, argv: list[str], cwd: str | None = None) -> list[str]:
    """``argv`` run where it reaches the cluster: in its namespaces (:meth:`Loopback.wrap`)."""
    return self.net.wrap(argv, cwd)

  def stop(self) -> None:
    for proc in reversed(self.procs):
      if proc.poll() is None:
        proc.terminate()
    for proc in self.procs:
      try:
        proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    self.net.stop()


def start_slurm(folder: str, cpus: int = 2, timeout: float = 60.0) -> SlurmCluster:
  """A one-node SLURM on this machine at 127.0.0.1, configured and run from ``folder``, in a
  network namespace of its own with only ``lo`` (:func:`start_loopback`).

  Raises:
    Unavailable: not root, the packages missing, no namespace, or a daemon did not come up.
  """
  need = ['munged', 'slurmctld', 'slurmd', 'sbatch', 'sinfo']
  missing = [b for b in need if shutil.which(b) is None and not os.path.exists(f'/usr/sbin/{b}')]
  if missing:
    raise Unavailable(f'SLURM or munge not installed ({", ".join(missing)}): apt-get install '
                      'slurm-wlm munge')
  if os.geteuid() != 0:
    raise Unavailable('the local SLURM runs its daemons as root; this user is not')
  os.makedirs(os.path.join(folder, 'state'), exist_ok=True)
  os.makedirs(os.path.join(folder, 'spool'), exist_ok=True)
  host = socket.gethostname().split('.')[0]
  conf = os.path.join(folder, 'slurm.conf')
  with open(conf, 'w') as f:
    f.write(SLURM_CONF.format(host=host, folder=folder, cpus=cpus, ctld_port=free_port(),
                              d_port=free_port()))
  key = os.path.join(folder, 'munge.key')
  with open(key, 'wb') as f:
    f.write(os.urandom(1024))
  os.chmod(key, 0o400)
  sbin = lambda b: shutil.which(b) or f'/usr/sbin/{b}'
  env = {**os.environ, 'SLURM_CONF': conf}
  procs: list[subprocess.Popen] = []
  net = start_loopback()
  cluster = SlurmCluster(conf, folder, net, procs)
  log = open(os.path.join(folder, 'daemons.log'), 'w')   # pylint: disable=consider-using-with
  try:
    procs.append(subprocess.Popen(net.wrap(
        [sbin('munged'), '--foreground', '--force', f'--key-file={key}',
         f'--socket={folder}/munge.sock', f'--pid-file={folder}/munged.pid',
         f'--log-file={folder}/munged.log', f'--seed-file={folder}/munge.seed']),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    _wait(lambda: os.path.exists(f'{folder}/munge.sock'), timeout, 'munged',
          f'{folder}/munged.log')
    procs.append(subprocess.Popen(net.wrap([sbin('slurmctld'), '-D', '-i', '-f', conf]), env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    procs.append(subprocess.Popen(net.wrap([sbin('slurmd'), '-D', '-f', conf, '-N', host]), env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def idle() -> bool:
      for p in procs:
        if p.poll() is not None:
          raise Unavailable(f'{p.args[0]} exited with status {p.returncode} (see {folder})')
      out = subprocess.run(net.wrap(['sinfo', '-h', '-o', '%T']), env=env, capture_output=True,
                           text=True, check=False).stdout
      return out.strip() in ('idle', 'mixed', 'allocated')

    _wait(idle, timeout, 'slurmd', f'{folder}/slurmd.log')
  except Unavailable:
    cluster.stop()
    raise
  return cluster


def announce(cluster: RayCluster | SlurmCluster) -> str:
  """What the command-line form prints once its cluster is up: how to reach it, and the
  ``nsenter`` prefix that runs a sweep in its namespace."""
  if isinstance(cluster, RayCluster):
    what, flags = f'Ray at {cluster.address}', f'--executor=ray --ray_address={cluster.address}'
  else:
    what, flags = f'SLURM up (export SLURM_CONF={cluster.conf})', '--executor=slurm'
  return (f'{what}, in a network namespace with only lo; run the sweep there:\n'
          f'  {cluster.net.shell_prefix()} python -m fedjax_kd.sweep ... {flags}')


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('kind', choices=('ray', 'slurm'))
  ap.add_argument('--folder', required=True)
  ap.add_argument('--nodes', type=int, default=2, help='ray: nodes')
  ap.add_argument('--cpus', type=int, default=1, help='CPUs a node')
  a = ap.parse_args(argv)
  folder = os.path.abspath(a.folder)
  try:
    cluster = (start_ray(folder, a.nodes, a.cpus) if a.kind == 'ray'
               else start_slurm(folder, a.cpus))
    print(announce(cluster), flush=True)
  except (Unavailable, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  try:
    while True:
      time.sleep(3600)
  except KeyboardInterrupt:
    pass
  finally:
    cluster.stop()
  return 0


if __name__ == '__main__':
  sys.exit(main())
