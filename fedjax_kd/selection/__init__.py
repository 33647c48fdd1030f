"""Client selection for every algorithm: which clients take part in each round.

The layer between the runner and an algorithm. Each round
:class:`ClientSelector` returns a :class:`RoundPlan`: the clients *selected* by the
configured method, the ones *active* after dropout, and each client's local epoch budget
(stragglers). Algorithms only see the ``active`` mask and ask
:meth:`ClientSelector.local_epochs` when they train.

Methods (``selection.method``) register like algorithms (:func:`register`, a
:class:`Method` subclass); each built-in one is a module holding its paper's math as pure
host-side numpy functions (float64) and its method class:

* ``'uniform'`` (:mod:`~fedjax_kd.selection.uniform`): ``M`` clients uniformly without
  replacement, a fresh draw each round.
* ``'fedentopt'`` (:mod:`~fedjax_kd.selection.fedentopt`): FedEntOpt's entropy-greedy
  cohorts with a FIFO buffer, the whole schedule computed up front.
* ``'power_of_choice'`` (:mod:`~fedjax_kd.selection.power_of_choice`): the highest-loss
  ``M`` of ``d`` size-weighted candidates, on the current model.
* ``'kl'`` (:mod:`~fedjax_kd.selection.kl`): Seol and Kim's greedy cohort towards uniform
  label counts, the same every round.

Cohort statistics shared by all are in :mod:`~fedjax_kd.selection.counts`; dropout and
stragglers, the same for every method, in :mod:`~fedjax_kd.selection.selector`.
"""

from fedjax_kd import registration
from fedjax_kd.selection import fedentopt as fedentopt
from fedjax_kd.selection import kl as kl
from fedjax_kd.selection import power_of_choice as power_of_choice
from fedjax_kd.selection import uniform as uniform
from fedjax_kd.selection.base import Method as Method
from fedjax_kd.selection.base import RoundPlan as RoundPlan
from fedjax_kd.selection.counts import cohort_entropy as cohort_entropy
from fedjax_kd.selection.counts import count_entropy as count_entropy
from fedjax_kd.selection.counts import entropy_bits as entropy_bits
from fedjax_kd.selection.counts import label_coverage as label_coverage
from fedjax_kd.selection.counts import schedule_stats as schedule_stats
from fedjax_kd.selection.fedentopt import dp_counts as dp_counts
from fedjax_kd.selection.fedentopt import fedentopt_round as fedentopt_round
from fedjax_kd.selection.fedentopt import fedentopt_schedule as fedentopt_schedule
from fedjax_kd.selection.fedentopt import TIE_BREAKS as TIE_BREAKS
from fedjax_kd.selection.fedentopt import TIE_TOL as TIE_TOL
from fedjax_kd.selection.kl import kl_selection as kl_selection
from fedjax_kd.selection.kl import kl_to_uniform as kl_to_uniform
from fedjax_kd.selection.power_of_choice import power_of_choice_candidates as power_of_choice_candidates
from fedjax_kd.selection.power_of_choice import power_of_choice_select as power_of_choice_select
from fedjax_kd.selection.selector import ClientSelector as ClientSelector
from fedjax_kd.selection.uniform import uniform_round as uniform_round
from fedjax_kd.selection.uniform import uniform_schedule as uniform_schedule

# In this order, which is the order an error lists them in.
METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (uniform.Uniform, fedentopt.FedEntOpt,
                              power_of_choice.PowerOfChoice, kl.KL)
}
_BUILT_IN = frozenset(METHODS)


def register(cls: type[Method], *, replace: bool = False) -> type[Method]:
  """Adds a selection method under ``cls.name`` (usable as a class decorator), as
  ``algorithms.register`` adds an algorithm: ``selection.method = cls.name`` then selects
  with it in every algorithm, the command line and sweeps (register in the config file).

  Raises:
    ValueError: not a :class:`Method` subclass, a name that is no identifier, a built-in
      name, or a name taken by another class (without ``replace``; the same class defined
      again, as when a config file is executed twice, replaces itself).
  """
  return registration.add(METHODS, cls, base=Method, base_name='selection.Method',
                          built_in=_BUILT_IN, where='selection.register',
                          kind='selection method', replace=replace)


def unregister(name: str) -> None:
  """Removes a method added with :func:`register` (built-in ones stay)."""
  registration.remove(METHODS, name, built_in=_BUILT_IN)
