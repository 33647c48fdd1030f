"""The shipped experiment configs; installed as ``fedjax_kd.configs``, so ``--config=NAME`` finds
``NAME.py`` here from any directory."""
