"""``python -m fedjax_kd.config --option_tables=docs/configs.md``: writes the option tables."""

import sys

from fedjax_kd import config

_args = [a for a in sys.argv[1:] if a.startswith('--option_tables=')]
if len(_args) != 1 or len(sys.argv) != 2:
  sys.exit('usage: python -m fedjax_kd.config --option_tables=docs/configs.md')
config.write_option_tables(_args[0].partition('=')[2])
print(f'wrote the option tables into {_args[0].partition("=")[2]}')
