"""The functional ops: pure, jittable functions over arrays and pytrees.

Each submodule names the paper it implements. They load on first use:
``fedjax_kd.ops.aggregate.era(...)`` works after ``import fedjax_kd``.
"""

from fedjax_kd import lazy_submodules

_SUBMODULES = ('aggregate', 'cache', 'cluster', 'codec', 'comm', 'density', 'errors',
               'knowledge_cache', 'krr', 'label_cluster', 'losses', 'param_aggregate',
               'privacy', 'temperature')
__getattr__, __dir__ = lazy_submodules(__name__, _SUBMODULES)
