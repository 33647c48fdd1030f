"""Sweeps through ``--executor=ray`` and ``--executor=slurm`` on real clusters on 127.0.0.1.

The long tier starts them (``benchmarks/performance/local_clusters.py``), each in a network
namespace of its own whose only interface is ``lo``, and runs every sweep command there too, so that
no packet leaves loopback: a Ray head and a second node, each with one CPU and its own ``ray
start`` process; munge, slurmctld and slurmd from Debian's packages. Where a cluster or its
namespace cannot start (not root, not installed) its tests skip and say why. Every run of a
cluster sweep must give the rows of the same sweep through the local executor, the timings
aside, and every try of a run must say it ran at 127.0.0.1.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from fedjax_kd import sweep
from fedjax_kd.errors import ConfigError
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import (
    executor_options, executors, planning, ray_executor, slurm_executor, workers)
from tests.shared import assert_rewrites_to_itself
from tests.test_main import REPO
from tests.test_sweep import sigint_at_default, sweep_env

sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
import local_clusters  # pylint: disable=g-import-not-at-top,wrong-import-position

# One worker runs them all, so that each cluster and the local reference start once.
pytestmark = pytest.mark.xdist_group('clusters')

ALGORITHMS, SEEDS = ('dsfl', 'single'), (0, 1)
NAMES = tuple(f'{a}/seed{s}' for a in ALGORITHMS for s in SEEDS)
# The default config's data with one small MLP for every client and the server: these tests
# are about where runs go and how they stop and resume, not about the model, and an MLP
# compiles and trains in a fraction of the CNN's time (every run is a fresh process).
SMALL = ("clients.models=('mlp@0.5',)", 'server.model=mlp@0.5')
SETS = ('rounds=3', 'checkpoint.every=1', 'log.tensorboard=False', *SMALL)
TIMEOUT_S = 600


def _argv(out, *extra, algorithms=ALGORITHMS, seeds=SEEDS, sets=SETS):
  argv = [sys.executable, '-m', 'fedjax_kd.sweep', '--config=configs/default.py',
          '--algorithms=' + ','.join(algorithms), '--seeds=' + ','.join(map(str, seeds)),
          f'--out={out}', *extra]
  for s in sets:
    argv += ['--set', s]
  return argv


def _sweep(out, *extra, env=None, cluster=None, **kw):
  """The sweep command, run where it reaches ``cluster`` (its namespace) if one is given."""
  argv = _argv(out, *extra, **kw)
  return subprocess.run(cluster.wrap(argv, REPO) if cluster else argv, cwd=REPO,
                        env=env or sweep_env(), capture_output=True, text=True,
                        timeout=TIMEOUT_S)


def _on_loopback(out, names):
  """Every try of every run in ``names`` ran at 127.0.0.1 (its node's address as its cluster
  reaches it)."""
  for name in names:
    recs = _attempts(out, name)
    assert recs and all(r.get('ip') == '127.0.0.1' for r in recs), (name, recs)


# What a sweep prints on its standard output: its own lines, none of Ray's.
OWN_LINE = re.compile(r"^(sweep: |ray: Ray's own messages go to |\[ *\d+/\d+\] |SIG(INT|TERM)[: ])")


def _own_lines_only(text):
  strays = [line for line in text.splitlines() if line and not OWN_LINE.match(line)]
  assert not strays, strays[:5]


def _rows(out, name):
  """A run's rows without the timings (keys ending in ``_s``)."""
  rows = workdir_lib.read_metrics(os.path.join(str(out), planning.RUNS_DIR, name))
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


def _attempts(out, name):
  return workers.attempts(os.path.join(str(out), planning.RUNS_DIR, name))


# Set by .ci/run where it can start both clusters (root, SLURM's daemons installed): a cluster
# that does not come up there fails its tests instead of skipping them.
CLUSTERS_ENV = 'FEDJAX_KD_TEST_CLUSTERS'


def _cannot_start(why: str):
  if os.environ.get(CLUSTERS_ENV) == 'required':
    pytest.fail(f'{why} (${CLUSTERS_ENV}=required)')
  pytest.skip(why)


# ------------------------------------------------------------ flags, without a cluster
def test_each_executor_flag_is_declared_once_and_checked():
  """Both commands take the same flags from ExecutorOptions; a bad value names its flag."""
  from benchmarks.reproduction import cli as repro_cli  # pylint: disable=g-import-not-at-top
  sweep_flags = {a.dest for a in sweep.cli._parser()._actions}   # pylint: disable=protected-access
  fields = {f for f in executor_options.ExecutorOptions.__dataclass_fields__}
  assert fields <= sweep_flags
  # The reproduction's run command parses the same flags and checks the executor's name
  # against the registry before anything runs.
  assert repro_cli.main(['run', '--executor=nowhere', '--only=dsfl']) == 2
  for flag, value, allowed in (('run_resources', 'CPU4', 'NAME=AMOUNT'),
                               ('run_resources', 'CPU=1,CPU=2', 'each name once'),
                               ('slurm_time', 'two hours', "SLURM's time format"),
                               ('slurm_cpus', 0, '>= 1'),
                               ('slurm_template', '/no/such.sbatch', 'an sbatch script')):
    with pytest.raises(ConfigError, match=allowed) as e:
      executor_options.ExecutorOptions(**{flag: value})
    assert e.value.field == f'--{flag}'
  o = executor_options.ExecutorOptions(executor='ray', run_resources='CPU=4,GPU=1,accel=0.5')
  assert o.resources == {'CPU': 4.0, 'GPU': 1.0, 'accel': 0.5}


def test_the_built_in_executors_are_registered_and_a_name_outside_it_is_one_line():
  assert list(executors.EXECUTORS) == ['local', 'ray', 'slurm']
  assert executors.executor_class('ray') is ray_executor.Ray
  with pytest.raises(ConfigError, match='local or ray or slurm') as e:
    executors.executor_class('nowhere')
  assert e.value.field == '--executor'
  with pytest.raises(ConfigError, match='registered executor'):
    executor_options.ExecutorOptions(executor='two words')
  with pytest.raises(ValueError, match="'slurm' is a built-in executor"):
    executors.register(type('S', (executor_options.Executor,), {'name': 'slurm'}))
  with pytest.raises(ValueError, match='not a subclass'):
    executors.register(type('T', (), {'name': 't'}))
  with pytest.raises(ValueError, match='must be an identifier'):
    executors.register(type('U', (executor_options.Executor,), {'name': 'a-b'}))


# A config file that registers an executor: each run is reported as not run, with a reason
# that names the executor, so the test sees the sweep dispatch to it without training.
REFUSING_FILE = """from fedjax_kd.sweep import executors, workers
from tests.shared import tiny_config


@executors.register
class Refusing(executors.Executor):
  name = 'refusing'
  help = 'reports every run as failed'

  def execute(self, runs, options, *, jobs, log, compilation_cache, home):
    return [workers.RunResult(r, 'failed', 0.0, f'refusing: not run (jobs={jobs})')
            for r in runs]


def get_config():
  return tiny_config()
"""


def test_a_config_file_registers_an_executor_that_the_sweep_then_runs_with(tmp_path, capsys):
  config = tmp_path / 'refusing_config.py'
  config.write_text(REFUSING_FILE)
  try:
    code = sweep.main([f'--config={config}', '--seeds=0,1', f'--out={tmp_path}/out',
                       '--executor=refusing', '--jobs=3'])
    out = capsys.readouterr()
    assert code == 1, out.out + out.err
    assert out.err.count('refusing: not run (jobs=3)') == 2, out.err
    assert not (tmp_path / 'out' / planning.RUNS_DIR / 'dsfl' / 'seed0' / 'summary.json').exists()
    # Its name in --help, beside the built-in ones.
    text = sweep.cli._parser().format_help()   # pylint: disable=protected-access
    assert 'refusing (reports every run as failed)' in ' '.join(text.split())
  finally:
    executors.unregister('refusing')
  with pytest.raises(ConfigError, match='local or ray or slurm'):
    executors.executor_class('refusing')


@pytest.mark.slow
def test_the_guide_executor_runs_a_sweep_from_its_config_file(tmp_path, capsys):
  from tests.test_docs_commands import block  # pylint: disable=g-import-not-at-top
  code = block('docs/cluster.md: from fedjax_kd.sweep import executors').text
  config = tmp_path / 'one_by_one.py'
  config.write_text(code + '\n\nfrom tests.shared import tiny_config\n\n\n'
                    'def get_config():\n  return tiny_config(rounds=2)\n')
  try:
    rc = sweep.main([f'--config={config}', '--seeds=0,1', f'--out={tmp_path}/out',
                     '--executor=one_by_one', '--jobs=2', '--set', 'log.tensorboard=False'])
    out = capsys.readouterr()
    assert rc == 0, out.out + out.err
    assert 'sweep: 2 done, 0 skipped, 0 failed' in out.out
    # One worker process took both runs: the local executor with --jobs=2 starts two.
    pids = {r['pid'] for s in SEEDS for r in _attempts(tmp_path / 'out', f'dsfl/seed{s}')}
    assert len(pids) == 1, pids
  finally:
    executors.unregister('one_by_one')


def test_ray_missing_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, 'ray', None)   # import ray raises ImportError
  code = sweep.main(['--config=configs/default.py', '--seeds=0', f'--out={tmp_path}/out',
                     '--executor=ray'])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1
  assert err[0].startswith("error: --executor='ray' is not allowed: expected Ray installed: "
                           "pip install 'fedjax_kd[ray]'")
  assert not os.path.exists(tmp_path / 'out' / planning.RUNS_DIR / 'default')   # nothing ran


def _free_port(host):
  with socket.socket() as sock:
    sock.bind((host, 0))
    return sock.getsockname()[1]


# 127.0.0.2: loopback, and not an address Ray rewrites into the machine's outward-facing one
# (it rewrites only localhost, 127.0.0.1 and ::1).
NOBODY = '127.0.0.2'


def test_a_ray_address_where_nothing_listens_is_one_line_within_seconds(
    tmp_path, capsys):
  pytest.importorskip('ray')
  address = f'{NOBODY}:{_free_port(NOBODY)}'
  t0 = time.monotonic()
  code = sweep.main(['--config=configs/default.py', '--seeds=0', f'--out={tmp_path}/out',
                     '--executor=ray', f'--ray_address={address}'])
  took = time.monotonic() - t0
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1, err
  assert err[0] == (f'error: --executor=ray: no Ray cluster at --ray_address={address} '
                    "(nothing listens there); start one with 'ray start --head', or give its "
                    "head's HOST:PORT (docs/cluster.md)")
  assert took < 15, took
  assert not os.path.exists(tmp_path / 'out' / planning.RUNS_DIR / 'default' / 'seed0' /
                            'metrics.jsonl')


def test_the_head_check_tells_a_silent_or_foreign_listener_from_a_grpc_server():
  """What answers at the address: nothing (refused), a listener that never speaks (no answer
  in the timeout), one that speaks something else, and one that answers the HTTP/2 preface
  with a SETTINGS frame, as a Ray head's gRPC server does."""
  assert ray_executor.head_answers(f'{NOBODY}:{_free_port(NOBODY)}', 1.0) == \
      'nothing listens there'

  def serve(reply):
    listener = socket.socket()
    listener.bind((NOBODY, 0))
    listener.listen()

    def answer():
      conn, _ = listener.accept()
      with conn:
        if reply is not None:
          conn.recv(len(ray_executor.HTTP2_PREFACE))
          conn.sendall(reply)
        time.sleep(2)
    threading.Thread(target=answer, daemon=True).start()
    return listener, f'{NOBODY}:{listener.getsockname()[1]}'

  silent, address = serve(None)
  t0 = time.monotonic()
  assert ray_executor.head_answers(address, 0.5) == 'no answer in 0.5 s'
  assert 0.5 <= time.monotonic() - t0 < 5
  http1, address2 = serve(b'HTTP/1.1 400 Bad Request\r\n\r\n')
  assert ray_executor.head_answers(address2, 2.0) == \
      'what answers there does not speak gRPC, as a Ray head does'
  # An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
  grpc_like, address3 = serve(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
  assert ray_executor.head_answers(address3, 2.0) is None
  for listener in (silent, http1, grpc_like):
    listener.close()


def test_slurm_without_its_commands_is_one_line(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv('PATH', str(tmp_path))
  code = sweep.main(['--config=configs/default.py', '--seeds=0', f'--out={tmp_path}/out',
                     '--executor=slurm'])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1
  assert 'sbatch, squeue, scancel, scontrol not found' in err[0]


def test_a_task_answer_is_the_last_json_line_of_its_output(tmp_path):
  (tmp_path / '7_1.out').write_text(
      'slurmstepd: some note\n{"status": "done", "wall_s": 3.5, "message": "acc 0.5"}\n'
      'slurmstepd: error: *** JOB 7 CANCELLED ***\n')
  assert slurm_executor.task_answer(str(tmp_path), '7_1') == {
      'status': 'done', 'wall_s': 3.5, 'message': 'acc 0.5'}
  (tmp_path / '7_2.out').write_text('{"not": "an answer"}\nerror: node x cannot see it\n')
  assert slurm_executor.task_answer(str(tmp_path), '7_2') is None
  assert slurm_executor.task_answer(str(tmp_path), '7_3') is None   # no file yet


def test_a_template_without_the_command_is_refused(tmp_path):
  t = tmp_path / 'mine.sbatch'
  t.write_text('#!/bin/bash\n#SBATCH --account=lab\nmodule load cuda\n')
  o = executor_options.ExecutorOptions(executor='slurm', slurm_template=str(t))
  with pytest.raises(ConfigError, match=r'\{command\}'):
    slurm_executor.script(o, '/x/list', ['sbatch'], None)
  t.write_text('#!/bin/bash\n#SBATCH --account=lab\nmodule load cuda\n{command}\n')
  text = slurm_executor.script(o, '/x/list', ['sbatch'], '/shared/cache')
  assert text.startswith('#!/bin/bash\n#SBATCH --account=lab\nmodule load cuda\nRUNDIR=')
  assert "export FEDJAX_KD_COMPILATION_CACHE=/shared/cache\n" in text
  assert text.rstrip().endswith('--_worker=- <<< "$RUNDIR"')


def test_the_array_script_runs_the_worker_on_its_line_of_the_run_list(tmp_path):
  """The script as an array task would run it (bash, SLURM's variables set by hand): task 1
  runs the run on the list's second line and records where; a line naming a folder the
  node cannot see is one error line."""
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top
  runs = sweep.plan(tiny_config('single', rounds=1), [sweep.Variant('single', 'single')],
                    [0, 1], {}, str(tmp_path / 'out'))
  workers.prepare(workers.Ledger(runs, None))
  listing = tmp_path / 'list.txt'
  listing.write_text(f'{tmp_path}/missing\n{os.path.abspath(runs[1].workdir)}\n')
  o = executor_options.ExecutorOptions(executor='slurm')
  script = tmp_path / 'a.sbatch'
  script.write_text(slurm_executor.script(o, str(listing), ['sbatch'], 'none'))
  env = {**sweep_env(), 'SLURM_ARRAY_JOB_ID': '41', 'SLURM_ARRAY_TASK_ID': '1',
         'SLURMD_NODENAME': 'n7'}
  proc = subprocess.run(['bash', str(script)], env=env, capture_output=True, text=True,
                        timeout=300, cwd=str(tmp_path))
  answer = json.loads(proc.stdout.strip().splitlines()[-1])
  assert proc.returncode == 0 and answer['status'] == 'done', proc.stderr[-2000:]
  (rec,) = workers.attempts(runs[1].workdir)
  assert (rec['executor'], rec['job'], rec['node']) == ('slurm', '41_1', 'n7')
  assert not workers.attempts(runs[0].workdir)
  env['SLURM_ARRAY_TASK_ID'] = '0'
  proc = subprocess.run(['bash', str(script)], env=env, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 2
  assert proc.stderr.strip() == (
      f"error: node n7 cannot see the run directory '{tmp_path}/missing' (line 1 of "
      f"{listing}): every node must see the sweep's folder at the same path (shared storage)")


def test_the_docs_overhead_table_is_what_the_archived_numbers_give(tmp_path):
  """docs/cluster.md's table is written by the benchmark from benchmarks/results/cluster_overhead.json."""
  import cluster_overhead  # pylint: disable=g-import-not-at-top
  numbers = os.path.join(REPO, 'benchmarks', 'results', 'cluster_overhead.json')
  assert_rewrites_to_itself(tmp_path, 'docs/cluster.md', cluster_overhead.main,
                            [f'--from_json={numbers}'])
  doc = json.loads(pathlib.Path(numbers).read_text())
  assert doc['runs'] == 8 and len(doc['times']['ray']) >= 3
  assert doc['ratio'] == pytest.approx(doc['ray_s'] / doc['local_s'])


def test_the_overhead_table_gives_the_medians_and_their_ratio():
  import cluster_overhead  # pylint: disable=g-import-not-at-top
  doc = {'runs': 8, 'jobs': 2, 'machine': '2 cores (test)', 'local_s': 40.0, 'ray_s': 46.0,
         'ratio': 1.15, 'times': {'local': [41.0, 40.0, 39.0], 'ray': [46.0, 50.0, 45.5]}}
  assert cluster_overhead.table(doc).splitlines() == [
      '8 tiny runs, 2 at a time, on 2 cores (test): a whole sweep command, median of 3 '
      '(after a warm-up of each)', '',
      '| executor | a sweep | against local | the sweeps |', '|---|---|---|---|',
      '| `local --jobs=2` | 40.0 s | 1.00x | 41.0, 40.0, 39.0 s |',
      '| `ray` (2 nodes of 1 CPU) | 46.0 s | 1.15x | 46.0, 50.0, 45.5 s |']


@pytest.mark.slow
def test_ctrl_c_while_joining_a_ray_cluster_starts_nothing_and_prints_no_traceback(tmp_path):
  """A head that takes the connection and never answers; SIGINT while the sweep waits on it:
  exit 130, its own lines only (the stop, and the summary), nothing on standard error."""
  pytest.importorskip('ray')
  listener = socket.socket()
  listener.bind((NOBODY, 0))
  listener.listen()
  address = f'{NOBODY}:{listener.getsockname()[1]}'
  joined = threading.Event()
  held = []

  def accept():
    held.append(listener.accept()[0])
    joined.set()

  threading.Thread(target=accept, daemon=True).start()
  proc = subprocess.Popen(_argv(tmp_path / 'out', '--executor=ray', f'--ray_address={address}',
                                algorithms=('single',), seeds=(0,)),
                          cwd=REPO, env=sweep_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, preexec_fn=sigint_at_default)
  try:
    assert joined.wait(60), 'the sweep never connected'
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
  finally:
    proc.kill()
    listener.close()
    for conn in held:
      conn.close()
  assert proc.returncode == 130, out + err
  assert not err.strip(), err
  _own_lines_only(out)
  assert (f'SIGINT while joining the Ray cluster at --ray_address={address}: nothing started; '
          'rerun the command to go on') in out.splitlines()
  assert 'sweep: 0 done, 0 skipped, 0 failed, 1 stopped' in out
  assert took < 15, took
  assert not workers.attempts(str(tmp_path / 'out' / planning.RUNS_DIR / 'single' / 'seed0'))


# ------------------------------------------------------------ the same sweep, locally
@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The sweep through the local executor: ``{run name: its rows}``."""
  out = tmp_path_factory.mktemp('local') / 'out'
  proc = _sweep(out, '--jobs=2')
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  return {n: _rows(out, n) for n in NAMES}


# The interrupted sweeps: runs long enough (15 rounds of the default CNN, about a second
# each) for a signal to land mid-run with rounds to spare.
LONG_ROUNDS = 15
LONG = dict(algorithms=('single',), seeds=(0, 1, 2, 3),
            sets=(f'rounds={LONG_ROUNDS}', 'checkpoint.every=1', 'log.tensorboard=False'))


@pytest.fixture(scope='module')
def long_reference(tmp_path_factory):
  """:data:`LONG` through the local executor, never stopped: ``{run name: its rows}``."""
  out = tmp_path_factory.mktemp('local_long') / 'out'
  proc = _sweep(out, '--jobs=2', **LONG)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  return {f'single/seed{s}': _rows(out, f'single/seed{s}') for s in LONG['seeds']}


# ------------------------------------------------------------ Ray
@pytest.fixture(scope='module')
def ray_cluster():
  pytest.importorskip('ray')
  # A short folder of its own: a worker's pytest folder is too long for Ray's sockets.
  folder = tempfile.mkdtemp(prefix='fedjax_kd_ray_', dir='/tmp')
  try:
    cluster = local_clusters.start_ray(folder, nodes=2, cpus=1)
  except local_clusters.Unavailable as e:
    shutil.rmtree(folder, ignore_errors=True)
    _cannot_start(f'no local Ray cluster on loopback only: {e}')
  yield cluster
  cluster.stop()
  shutil.rmtree(folder, ignore_errors=True)


def test_a_ray_folder_too_long_for_its_sockets_is_refused_before_anything_starts(tmp_path):
  folder = str(tmp_path / ('x' * local_clusters.RAY_FOLDER_MAX))
  with pytest.raises(ValueError, match=r"Ray's folder .* characters: its nodes' socket paths "
                                       r'under it would pass the 107 bytes'):
    local_clusters.start_ray(folder)
  assert not os.path.exists(folder)


def test_the_cluster_tests_share_one_worker(request):
  """Under pytest-xdist's --dist=loadgroup (the tiers' default) this module's tests are one
  group, on one worker, so that each cluster starts once: pytest-xdist marks a test's node id
  with its group (pytest 9.2 dropped what it renames, and the group's tests went to every
  worker, each starting its own clusters)."""
  if getattr(request.config.option, 'loadgroup', False):
    assert request.node.nodeid.endswith('@clusters'), request.node.nodeid


@pytest.mark.slow
def test_the_ray_cluster_has_only_loopback_and_its_nodes_are_at_127_0_0_1(ray_cluster):
  """Its namespace holds lo alone, and the cluster lists each node at 127.0.0.1 (outside one,
  Ray would register them at the machine's outward-facing address)."""
  assert ray_cluster.net.interfaces() == ['lo']
  nodes = ray_cluster.alive()
  assert set(nodes) >= set(ray_cluster.ids[:2]) and set(nodes.values()) == {'127.0.0.1'}


@pytest.mark.slow
def test_a_sweep_through_ray_gives_the_local_rows_and_runs_on_both_nodes(
    tmp_path, reference, ray_cluster):
  out = tmp_path / 'out'
  proc = _sweep(out, '--executor=ray', f'--ray_address={ray_cluster.address}',
                cluster=ray_cluster)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert 'sweep: 4 done, 0 skipped, 0 failed' in proc.stdout
  assert f"ray: Ray's own messages go to {out}/{ray_executor.RAY_LOG}" in proc.stdout
  _own_lines_only(proc.stdout)
  assert not proc.stderr.strip(), proc.stderr[-3000:]
  nodes = set()
  for name in NAMES:
    (rec,) = _attempts(out, name)   # each run ran once, and says where
    assert rec['executor'] == 'ray'
    nodes.add(rec['node'])
    assert _rows(out, name) == reference[name], name
  assert len(nodes) == 2
  _on_loopback(out, NAMES)
  # Rerun: every run skipped, nothing submitted, the files untouched.
  again = _sweep(out, '--executor=ray', f'--ray_address={ray_cluster.address}',
                 cluster=ray_cluster)
  assert again.returncode == 0 and 'sweep: 0 done, 4 skipped' in again.stdout
  assert all(len(_attempts(out, n)) == 1 for n in NAMES)


@pytest.mark.slow
def test_ctrl_c_stops_the_ray_runs_after_their_round_and_a_rerun_finishes_them(
    tmp_path, ray_cluster, long_reference):
  """SIGINT to the sweep while two runs are on the cluster and two wait: the waiting ones are
  cancelled, the running ones stop after their round with a checkpoint; rerunning the
  command resumes them, and every run ends with the rows of a sweep never stopped."""
  kw = LONG
  out = tmp_path / 'out'
  argv = ray_cluster.wrap(_argv(out, '--executor=ray', f'--ray_address={ray_cluster.address}',
                                **kw), REPO)
  log = open(tmp_path / 'sweep.out', 'w')   # pylint: disable=consider-using-with
  proc = subprocess.Popen(argv, cwd=REPO, env=sweep_env(), stdout=log, stderr=subprocess.STDOUT,
                          preexec_fn=sigint_at_default)
  names = [f'single/seed{s}' for s in kw['seeds']]
  deadline = time.monotonic() + TIMEOUT_S
  caught = False
  while not caught and time.monotonic() < deadline and proc.poll() is None:
    for name in names:
      ckpts = out / planning.RUNS_DIR / name / 'checkpoints'
      caught = caught or (ckpts.is_dir() and any(n.isdigit() and int(n) >= 2
                                                 for n in os.listdir(ckpts)))
    time.sleep(0.1)
  assert caught, (tmp_path / 'sweep.out').read_text()[-3000:]
  proc.send_signal(signal.SIGINT)
  assert proc.wait(timeout=TIMEOUT_S) == 130, (tmp_path / 'sweep.out').read_text()[-3000:]
  text = (tmp_path / 'sweep.out').read_text()
  assert 'SIGINT: the running runs stop after their current round' in text
  at, finished = {}, 0
  for n in names:   # each finished before the signal, stopped after a round, or not started
    summary = workdir_lib.read_json(str(out / planning.RUNS_DIR / n), 'summary.json') or {}
    if summary.get('stopped_by'):
      assert summary['stopped_by'] == 'SIGINT' and summary['rounds'] < LONG_ROUNDS, (n, summary)
      at[n] = summary['rounds']
    elif summary:
      assert summary['rounds'] == LONG_ROUNDS, (n, summary)
      finished += 1
    else:
      assert len(_attempts(out, n)) <= 1, n   # cancelled before it started, or just starting
  assert 1 <= len(at) <= 2 and finished + len(at) < 4, text   # one a node was running
  again = subprocess.run(argv, cwd=REPO, env=sweep_env(), capture_output=True, text=True,
                         timeout=TIMEOUT_S)
  assert again.returncode == 0, again.stdout + again.stderr
  assert f'sweep: {4 - finished} done, {finished} skipped, 0 failed' in again.stdout
  for n, k in at.items():
    (line,) = [ln for ln in again.stdout.splitlines() if ln.split()[1:3] == ['done', n]]
    assert line.endswith(f'(resumed after round {k})'), line
  for n in names:
    assert _rows(out, n) == long_reference[n], n
  _on_loopback(out, [n for n in names if _attempts(out, n)])


@pytest.mark.slow
def test_the_reproduction_runs_through_ray_to_its_compare_md(tmp_path, ray_cluster):
  """``python -m benchmarks.reproduction run --executor=ray`` (one tiny sweep), then ``report``."""
  runs = tmp_path / 'runs'
  script = [sys.executable, '-m', 'benchmarks.reproduction']
  r = subprocess.run(ray_cluster.wrap(
      script + ['run', f'--runs={runs}', '--tiny', '--only=dsfl', '--sweeps=dsfl_digits',
                '--executor=ray', f'--ray_address={ray_cluster.address}',
                '--run_resources=CPU=1'], REPO),
                     cwd=REPO, env=sweep_env(), capture_output=True, text=True,
                     timeout=TIMEOUT_S)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  planned = sweep.load_plan(str(runs / 'dsfl_digits'))['runs']
  assert planned and (runs / 'dsfl_digits' / 'compare.md').exists()
  for p in planned:
    (rec,) = workers.attempts(str(runs / 'dsfl_digits' / p['workdir']))
    assert rec['executor'] == 'ray' and rec['ip'] == '127.0.0.1'
  out = tmp_path / 'reproduction.md'
  r = subprocess.run(script + ['report', f'--runs={runs}', f'--out={out}', '--tiny',
                               '--only=dsfl'], cwd=REPO, env=sweep_env(), capture_output=True,
                     text=True, timeout=TIMEOUT_S)
  assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
  assert out.read_text().startswith('# Reproduction report')


@pytest.mark.slow
def test_a_node_lost_mid_run_leaves_every_run_finished_once_with_the_local_rows(
    tmp_path, reference, ray_cluster):
  """A third node joins; once a run is on it, it is killed outright (SIGKILL to its raylet,
  workers and the run's process). Ray retries the run on a node left; it resumes there."""
  node = ray_cluster.add_node()
  out = tmp_path / 'out'
  log = open(tmp_path / 'sweep.out', 'w')   # pylint: disable=consider-using-with
  proc = subprocess.Popen(
      ray_cluster.wrap(_argv(out, '--executor=ray', f'--ray_address={ray_cluster.address}'),
                       REPO), cwd=REPO, env=sweep_env(), stdout=log, stderr=subprocess.STDOUT)
  victim, deadline = None, time.monotonic() + TIMEOUT_S
  while victim is None and time.monotonic() < deadline and proc.poll() is None:
    for name in NAMES:
      recs = _attempts(out, name)
      if recs and recs[-1]['node'] == ray_cluster.ids[node]:
        victim = name
        break
    time.sleep(0.2)
  assert victim is not None, 'no run was caught on the third node'
  ray_cluster.kill_node(node)
  assert proc.wait(timeout=TIMEOUT_S) == 0, (tmp_path / 'sweep.out').read_text()[-3000:]
  text = (tmp_path / 'sweep.out').read_text()
  assert 'sweep: 4 done, 0 skipped, 0 failed' in text
  for name in NAMES:
    assert sum(line.split()[1:3] == ['done', name] for line in text.splitlines()) == 1, text
    assert _rows(out, name) == reference[name], name
  recs = _attempts(out, victim)
  assert len(recs) == 2 and recs[0]['node'] != recs[1]['node']
  assert 'after its node was lost' in text
  _own_lines_only(text)   # Ray's lines about the lost node are in its log, not here
  _on_loopback(out, NAMES)


@pytest.mark.slow
def test_a_node_whose_raylet_alone_dies_stops_its_run_before_the_retry_resumes_it(
    tmp_path, ray_cluster, long_reference):
  """A fourth node joins; once a run on it has saved a checkpoint, only its raylet is killed
  (its Ray workers and the run's process are not). The run's process stops and exits before
  the retry on a node left starts the run again, which resumes from the newest checkpoint
  that process left. Every run ends once with the rows of a sweep never disturbed, and the
  sweep prints none of Ray's lines about the lost node.

  What stops it is a race, both ways of which lose nothing: the run's worker follows the
  raylet and, once it sees it gone, stops after its round with a checkpoint (NODE_ENV:
  ``test_a_worker_whose_node_daemon_is_gone_gets_sigterm`` tests that alone); or the node's
  Ray worker exits first (Ray 2.60 ends a raylet's workers within seconds of it) and Ray
  kills its child processes, the run's worker among them, mid-round. Both can happen to one
  run: it sees the raylet gone, and Ray kills it before its round ends."""
  node = ray_cluster.add_node()
  out = tmp_path / 'out'
  stdout, stderr = open(tmp_path / 'sweep.out', 'w'), open(tmp_path / 'sweep.err', 'w')   # pylint: disable=consider-using-with
  proc = subprocess.Popen(
      ray_cluster.wrap(_argv(out, '--executor=ray', f'--ray_address={ray_cluster.address}',
                             **LONG), REPO), cwd=REPO, env=sweep_env(), stdout=stdout,
      stderr=stderr)
  names = [f'single/seed{s}' for s in LONG['seeds']]
  victim, deadline = None, time.monotonic() + TIMEOUT_S
  while victim is None and time.monotonic() < deadline and proc.poll() is None:
    for name in names:
      recs = _attempts(out, name)
      ckpts = out / planning.RUNS_DIR / name / 'checkpoints'
      if (recs and recs[-1]['node'] == ray_cluster.ids[node] and ckpts.is_dir()
          and any(n.isdigit() and int(n) >= 2 for n in os.listdir(ckpts))):
        victim = name
        break
    time.sleep(0.1)
  assert victim is not None, 'no run was caught on the fourth node'
  lost = _attempts(out, victim)[0]['pid']   # the run's worker process on that node
  ckpts = out / planning.RUNS_DIR / victim / 'checkpoints'
  ray_cluster.kill_raylet(node)
  t0 = time.monotonic()
  while time.monotonic() - t0 < 120:
    if workers.process_token(lost) is None:
      break
    # While it lives, no other process has started the run (no second try recorded).
    assert len(_attempts(out, victim)) == 1, 'the retry started beside the lost worker'
    time.sleep(0.05)
  else:
    pytest.fail('the lost node\'s worker still runs 120 s after its raylet died')
  left = max(int(n) for n in os.listdir(ckpts) if n.isdigit())   # its newest checkpoint
  assert proc.wait(timeout=TIMEOUT_S) == 0, (tmp_path / 'sweep.out').read_text()[-3000:]
  text, err = (tmp_path / 'sweep.out').read_text(), (tmp_path / 'sweep.err').read_text()
  assert 'sweep: 4 done, 0 skipped, 0 failed' in text, text
  _own_lines_only(text)
  assert not err.strip(), err[-3000:]
  log = (out / planning.RUNS_DIR / victim / planning.LOG_FILE).read_text()
  assert f'resumed from {ckpts} after round {left}' in log, log[-3000:]
  stopped = re.findall(r'stopped after round (\d+);', log)
  assert stopped in ([], [str(left)]), log[-3000:]   # if it stopped itself, at its newest save
  for name in names:
    assert sum(line.split()[1:3] == ['done', name] for line in text.splitlines()) == 1, text
    assert _rows(out, name) == long_reference[name], name
  recs = _attempts(out, victim)
  assert len(recs) == 2 and recs[0]['node'] != recs[1]['node']
  _on_loopback(out, names)


@pytest.mark.slow
def test_a_node_that_cannot_see_the_folder_is_one_line_and_nothing_starts(
    tmp_path, ray_cluster):
  """A node whose file system hides this test's folder (a tmpfs mounted over it in its own
  mount namespace): the check before any run names the node and the file."""
  hide = ['unshare', '--mount', '--propagation', 'private', 'sh', '-c',
          'mount -t tmpfs tmpfs "$0" && exec "$@"', str(tmp_path)]
  if subprocess.run(hide[:-1] + ['/tmp', 'true'], capture_output=True,
                    check=False).returncode:
    pytest.skip('no mount namespaces here (unshare --mount needs CAP_SYS_ADMIN)')
  node = ray_cluster.add_node(wrap=hide)
  try:
    out = tmp_path / 'out'
    proc = _sweep(out, '--executor=ray', f'--ray_address={ray_cluster.address}',
                  cluster=ray_cluster)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stdout + proc.stderr
    assert err[0].startswith('error: --executor=ray: node ')
    assert f"does not see this machine's files: it read 'cannot read it (No such file or " \
           f"directory)' from {out}/{planning.RUNS_DIR}/{executor_options.PROBE_PREFIX}" in err[0]
    assert err[0].endswith('nothing was started')
    assert not any(os.path.exists(os.path.join(out, planning.RUNS_DIR, n, 'metrics.jsonl'))
                   for n in NAMES)
    assert not [n for n in os.listdir(out / planning.RUNS_DIR)
                if n.startswith(executor_options.PROBE_PREFIX)]   # the probe removed
  finally:
    ray_cluster.kill_node(node)


# ------------------------------------------------------------ SLURM
@pytest.fixture(scope='module')
def slurm(tmp_path_factory):
  folder = tmp_path_factory.mktemp('slurm')
  try:
    cluster = local_clusters.start_slurm(str(folder), cpus=2)
  except local_clusters.Unavailable as e:
    _cannot_start(f'no local SLURM on loopback only: {e}')
  yield cluster
  cluster.stop()


@pytest.mark.slow
def test_a_sweep_through_slurm_gives_the_local_rows(tmp_path, reference, slurm):
  out = tmp_path / 'out'
  env = {**sweep_env(), 'SLURM_CONF': slurm.conf}
  assert slurm.net.interfaces() == ['lo']
  proc = _sweep(out, '--executor=slurm', '--slurm_partition=debug', '--slurm_cpus=1',
                '--slurm_time=30', '--slurm_max_running=2', env=env, cluster=slurm)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert 'sweep: 4 done, 0 skipped, 0 failed' in proc.stdout
  (script,) = (out / slurm_executor.SLURM_DIR).glob('array-*.sbatch')
  assert ('--array=0-3%2 --job-name=fedjax_kd' in script.read_text()
          and '--cpus-per-task=1 --partition=debug --time=30' in script.read_text())
  (job,) = slurm_executor.read_jobs(str(out / slurm_executor.SLURM_DIR))
  for name in NAMES:
    (rec,) = _attempts(out, name)
    k = job['runs'].index(str(out / planning.RUNS_DIR / name))
    assert (rec['executor'], rec['job']) == ('slurm', f'{job["job"]}_{k}')
    assert _rows(out, name) == reference[name], name
  _on_loopback(out, NAMES)   # each task's node as its controller reaches it


@pytest.mark.slow
def test_a_cancelled_array_task_resumes_from_its_checkpoint_when_the_command_reruns(
    tmp_path, slurm, long_reference):
  """scancel of one array task mid-run: its run stops after its round with a checkpoint
  (SLURM's SIGTERM); the rerun submits only that run, which resumes and ends with the rows
  of a run never cancelled."""
  kw = {**LONG, 'seeds': (0, 1)}
  out = tmp_path / 'out'
  env = {**sweep_env(), 'SLURM_CONF': slurm.conf}
  log = open(tmp_path / 'sweep.out', 'w')   # pylint: disable=consider-using-with
  proc = subprocess.Popen(slurm.wrap(_argv(out, '--executor=slurm', **kw), REPO), cwd=REPO,
                          env=env, stdout=log, stderr=subprocess.STDOUT)
  rundir = out / planning.RUNS_DIR / 'single' / 'seed1'
  deadline = time.monotonic() + TIMEOUT_S
  while time.monotonic() < deadline and proc.poll() is None:
    ckpts = rundir / 'checkpoints'
    if ckpts.is_dir() and any(n.isdigit() and int(n) >= 2 for n in os.listdir(ckpts)):
      break
    time.sleep(0.1)
  (rec,) = workers.attempts(str(rundir))
  subprocess.run(slurm.wrap(['scancel', rec['job']]), env=env, check=True)
  code = proc.wait(timeout=TIMEOUT_S)
  text = (tmp_path / 'sweep.out').read_text()
  assert code in (130, 143), text
  assert 'sweep: 1 done, 0 skipped, 0 failed, 1 stopped' in text, text
  summary = workdir_lib.read_json(str(rundir), 'summary.json')
  assert summary['stopped_by'] == 'SIGTERM' and summary['rounds'] < LONG_ROUNDS
  again = _sweep(out, '--executor=slurm', env=env, cluster=slurm, **kw)
  assert again.returncode == 0, again.stdout + again.stderr
  assert 'sweep: 1 done, 1 skipped, 0 failed' in again.stdout
  assert f'resumed after round {summary["rounds"]}' in again.stdout
  jobs = slurm_executor.read_jobs(str(out / slurm_executor.SLURM_DIR))
  assert [len(j['runs']) for j in jobs] == [2, 1]   # the rerun submitted only that run
  for name in ('single/seed0', 'single/seed1'):
    assert _rows(out, name) == long_reference[name], name
  _on_loopback(out, ('single/seed0', 'single/seed1'))


@pytest.mark.slow
def test_detach_returns_at_once_and_the_rerun_collects_the_queued_tasks(tmp_path, slurm):
  """--detach submits and returns; the same command rerun submits nothing new, waits for the
  tasks still queued and writes the outputs once they end."""
  kw = dict(algorithms=('single',), seeds=(0, 1))
  out = tmp_path / 'out'
  env = {**sweep_env(), 'SLURM_CONF': slurm.conf}
  first = _sweep(out, '--executor=slurm', '--detach', env=env, cluster=slurm, **kw)
  assert first.returncode == 0, first.stdout + first.stderr
  assert '0 done, 0 skipped, 0 failed, 2 left to SLURM (rerun to collect)' in first.stdout
  again = _sweep(out, '--executor=slurm', env=env, cluster=slurm, **kw)
  assert again.returncode == 0, again.stdout + again.stderr
  jobs = slurm_executor.read_jobs(str(out / slurm_executor.SLURM_DIR))
  assert len(jobs) == 1   # the rerun found both runs queued or finished: nothing resubmitted
  # Each run is collected once: waited for (done) if still queued, else found finished.
  counts = re.search(r'sweep: (\d+) done, (\d+) skipped, 0 failed', again.stdout)
  assert counts and int(counts[1]) + int(counts[2]) == 2, again.stdout
  assert (out / 'compare.md').exists()
  for name in ('single/seed0', 'single/seed1'):
    (rec,) = _attempts(out, name)
    assert rec['executor'] == 'slurm' and rec['job'].startswith(jobs[0]['job'] + '_')
    assert rec['ip'] == '127.0.0.1'

