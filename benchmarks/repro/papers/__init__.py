"""One module per paper: its variant tables, sweeps and checks, as a ``section()`` that
:mod:`benchmarks.repro.sections` assembles into the report's order."""
