"""Algorithms, one module per paper; ``ALGORITHMS`` maps config names to classes."""

from fedjax_kd.algorithms.acepfl import ACEPFL, FedMD
from fedjax_kd.algorithms.base import AlgState, Algorithm, Context, Round, RoundOutput
from fedjax_kd.algorithms.centralized import Centralized
from fedjax_kd.algorithms.cfd import CFD
from fedjax_kd.algorithms.comet import COMET
from fedjax_kd.algorithms.dsfl import DSFL
from fedjax_kd.algorithms.fd import FD
from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.algorithms.fedcache2 import FedCache2
from fedjax_kd.algorithms.fednova import FedNova
from fedjax_kd.algorithms.fedprox import FedProx
from fedjax_kd.algorithms.scaffold import SCAFFOLD
from fedjax_kd.algorithms.scarlet import SCARLET
from fedjax_kd.algorithms.selective_fd import SelectiveFD
from fedjax_kd.algorithms.single import Single

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls for cls in (DSFL, FedAvg, FD, Single, SCARLET, CFD, COMET, SelectiveFD,
                              Centralized, FedCache2, ACEPFL, FedMD, FedProx, SCAFFOLD,
                              FedNova)
}
ALGORITHMS['individual'] = Single   # SCARLET's name for the same baseline
