"""One module per paper: its variant tables, sweeps and checks, as a ``section()`` that
:mod:`benchmarks.reproduction.sections` assembles into the report's order."""
