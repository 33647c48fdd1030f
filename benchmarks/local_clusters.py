r"""Real Ray and SLURM clusters on this machine, for the executors' tests and benchmark.

  python benchmarks/local_clusters.py ray --folder=/tmp/ray_here     # prints the address
  python benchmarks/local_clusters.py slurm --folder=/tmp/slurm_here # prints SLURM_CONF

Ray: a head node and more nodes, each its own ``ray start --block`` process (its own process
group, so a test can kill a node outright), on 127.0.0.1 with the CPUs given. SLURM: munge,
slurmctld and slurmd from the distribution's packages (Debian: ``apt-get install slurm-wlm
munge``), configured in ``folder`` for this one machine (run as root; no cgroups, no
accounting), its clients pointed at it by ``SLURM_CONF``. Each ``start_*`` returns a handle
whose ``stop()`` ends what it started; both raise :class:`Unavailable` with the reason where
they cannot start (a test then skips with it). The command-line form starts one and keeps it
until Ctrl-C, to try docs/cluster.md on one machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
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


@dataclasses.dataclass
class RayCluster:
  """A head and worker nodes, each a ``ray start --block`` process group."""
  address: str
  folder: str
  nodes: list[subprocess.Popen]
  cpus: int = 1
  timeout: float = 120.0
  ids: list[str] = dataclasses.field(default_factory=list)   # each node's Ray node id

  def add_node(self, wrap: list[str] | None = None) -> int:
    """Starts one more node (under the command ``wrap``, e.g. ``unshare``, if given) and
    waits until the cluster lists it; returns its index in :attr:`nodes`.

    Raises:
      Unavailable: it did not come up.
    """
    k = len(self.nodes)
    before = _alive(self.address)
    node_log = os.path.join(self.folder, f'node{k}.log')
    cmd = [_ray_bin(), 'start', f'--address={self.address}'] + _node_flags(self.cpus)
    with open(node_log, 'w') as log:
      self.nodes.append(subprocess.Popen((wrap or []) + cmd, stdout=log,
                                         stderr=subprocess.STDOUT, env=_ray_env(self.folder),
                                         start_new_session=True))
    new: set[str] = set()

    def joined() -> bool:
      new.update(_alive(self.address) - before)
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

  def stop(self) -> None:
    """Ends every node: SIGTERM to each process group, SIGKILL to what is left after 10 s."""
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


def start_ray(folder: str, nodes: int = 2, cpus: int = 1, timeout: float = 120.0
              ) -> RayCluster:
  """A Ray cluster of ``nodes`` nodes with ``cpus`` CPUs each on 127.0.0.1.

  Args:
    folder: Ray's temporary folder (sessions, logs; short: Ray's socket paths are limited).
    nodes: the head and ``nodes - 1`` more (:meth:`RayCluster.add_node` adds others).
    cpus: each node's CPUs.
    timeout: seconds for each node to show in the cluster.

  Raises:
    Unavailable: Ray missing, or a node did not come up.
  """
  ray = _ray_bin()
  os.makedirs(folder, exist_ok=True)
  port = free_port()
  address = f'127.0.0.1:{port}'
  head_log = os.path.join(folder, 'head.log')
  with open(head_log, 'w') as log:
    head = subprocess.Popen(
        [ray, 'start', '--head', f'--port={port}', '--include-dashboard=false',
         f'--temp-dir={folder}'] + _node_flags(cpus), stdout=log, stderr=subprocess.STDOUT,
        env=_ray_env(folder), start_new_session=True)
  cluster = RayCluster(address, folder, [head], cpus, timeout)
  try:
    _wait(lambda: bool(_alive(address)), timeout, 'the Ray head', head_log)
    cluster.ids.append(sorted(_alive(address))[0])
    for _ in range(1, nodes):
      cluster.add_node()
  except Unavailable:
    cluster.stop()
    raise
  return cluster


def _alive(address: str) -> set[str]:
  """The ids of the nodes the cluster at ``address`` lists as alive (none: no answer). By id,
  not by count: a node just killed stays listed until the cluster notices."""
  code = ('import ray, sys\n'
          f'ray.init(address="{address}", logging_level="ERROR", log_to_driver=False)\n'
          'print(" ".join(n["NodeID"] for n in ray.nodes() if n["Alive"]))\n')
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        check=False, timeout=120)
  lines = proc.stdout.strip().splitlines()
  return set(lines[-1].split()) if proc.returncode == 0 and lines else set()


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
  """munged, slurmctld and slurmd in the foreground, and the ``SLURM_CONF`` for clients."""
  conf: str
  folder: str
  procs: list[subprocess.Popen]

  def env(self) -> dict[str, str]:
    return {**os.environ, 'SLURM_CONF': self.conf}

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


def start_slurm(folder: str, cpus: int = 2, timeout: float = 60.0) -> SlurmCluster:
  """A one-node SLURM on this machine, configured and run from ``folder``.

  Raises:
    Unavailable: not root, the packages missing, or a daemon did not come up.
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
  cluster = SlurmCluster(conf, folder, procs)
  log = open(os.path.join(folder, 'daemons.log'), 'w')   # pylint: disable=consider-using-with
  try:
    procs.append(subprocess.Popen(
        [sbin('munged'), '--foreground', '--force', f'--key-file={key}',
         f'--socket={folder}/munge.sock', f'--pid-file={folder}/munged.pid',
         f'--log-file={folder}/munged.log', f'--seed-file={folder}/munge.seed'],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    _wait(lambda: os.path.exists(f'{folder}/munge.sock'), timeout, 'munged',
          f'{folder}/munged.log')
    procs.append(subprocess.Popen([sbin('slurmctld'), '-D', '-i', '-f', conf], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    procs.append(subprocess.Popen([sbin('slurmd'), '-D', '-f', conf, '-N', host], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def idle() -> bool:
      for p in procs:
        if p.poll() is not None:
          raise Unavailable(f'{p.args[0]} exited with status {p.returncode} (see {folder})')
      out = subprocess.run(['sinfo', '-h', '-o', '%T'], env=env, capture_output=True,
                           text=True, check=False).stdout
      return out.strip() in ('idle', 'mixed', 'allocated')

    _wait(idle, timeout, 'slurmd', f'{folder}/slurmd.log')
  except Unavailable:
    cluster.stop()
    raise
  return cluster


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('kind', choices=('ray', 'slurm'))
  ap.add_argument('--folder', required=True)
  ap.add_argument('--nodes', type=int, default=2, help='ray: nodes')
  ap.add_argument('--cpus', type=int, default=1, help='CPUs a node')
  a = ap.parse_args(argv)
  folder = os.path.abspath(a.folder)
  try:
    if a.kind == 'ray':
      cluster = start_ray(folder, a.nodes, a.cpus)
      print(f'Ray at {cluster.address}: --executor=ray --ray_address={cluster.address}',
            flush=True)
    else:
      cluster = start_slurm(folder, a.cpus)
      print(f'SLURM up: export SLURM_CONF={cluster.conf}', flush=True)
  except Unavailable as e:
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
