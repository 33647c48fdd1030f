"""The tiny experiment the tests share, in a module without side effects: config files
that tests write (and run in subprocesses) import it, which importing ``conftest`` (it sets
up the session's compilation cache) must not do."""


# A config file of the tiny experiment, for commands that take ``--config=FILE`` (run with the
# repository as the working folder, so that ``tests`` imports).
TINY_FILE = 'from tests.shared import tiny_config\n\ndef get_config():\n  return tiny_config()\n'


def tiny_config(algorithm: str = 'dsfl', rounds: int = 3, **overrides):
  """The tiny experiment the tests share: ``algorithm`` on 600 synthetic images, four clients
  of small MLPs (one width for FedAvg, two otherwise), one epoch each, 100 of 150 public
  samples a round. ``overrides`` are dotted fields: ``tiny_config(**{'data.source': ...})``.
  """
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd import presets  # pylint: disable=g-import-not-at-top
  c = presets.digits(algorithm)
  c.rounds = rounds
  c.data.source = 'synthetic:600'
  c.data.num_public = 150
  c.clients.num_clients = 4
  c.clients.models = ['mlp@0.25'] if algorithm == 'fedavg' else ['mlp@0.25', 'mlp@0.5']
  c.server.model = 'mlp@0.5'
  c.train.epochs = 1
  c.distill.epochs = 1
  c.distill.public_per_round = 100
  return config_lib.override(c, overrides)


def steps_of_activations(monkeypatch) -> None:
  """Makes the memory planner's figure for a step 1 MiB per client at once (``monkeypatch``,
  pytest's), as where activations dominate (a CNN's): on the tiny experiment's small MLPs
  the clients' states do, and running them in chunks would not save memory (a chunked
  training holds the slots' new states besides their gathered ones)."""
  from fedjax_kd import memory  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(memory, '_probe', lambda *args: args[6] << 20)   # args[6]: clients
  monkeypatch.setattr(memory, '_bound_one', lambda *args: 1 << 20)     # one client's bound


def assert_rewrites_to_itself(tmp_path, doc: str, main, argv, flag: str = '--markdown') -> None:
  """A table command (``main(argv + [flag=PAGE])``) run on a copy of the committed page
  ``doc`` (e.g. ``'docs/configs.md'``) leaves it as committed: its table is the script's
  output, never edited by hand."""
  import pathlib  # pylint: disable=g-import-not-at-top
  committed = (pathlib.Path(__file__).resolve().parents[1] / doc).read_text()
  page = tmp_path / pathlib.Path(doc).name
  page.write_text(committed)
  assert main([*argv, f'{flag}={page}']) == 0
  assert page.read_text() == committed
