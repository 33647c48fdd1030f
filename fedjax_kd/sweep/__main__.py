"""``python -m fedjax_kd.sweep``: see :mod:`fedjax_kd.sweep`."""

from fedjax_kd.sweep.cli import entry

if __name__ == '__main__':
  entry()
