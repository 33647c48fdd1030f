"""The reproduction report (``python -m benchmarks.reproduction``), in layers, each module
importing only modules of the layers above it:

* :mod:`.verdicts`, :mod:`.stats`: paired tests over seeds and the four-way verdicts;
  :mod:`.checks`: a claim tested on a sweep's table and the builders of its tests;
* :mod:`.defs`: a sweep and a paper's section, the shared seeds and --tiny settings;
  :mod:`.papers` (one module per paper): the variants, sweeps and checks;
  :mod:`.sections`: the papers in the report's order; :mod:`.claims`: the papers' claims;
* :mod:`.plan`: planning a sweep and the commands that remake it; :mod:`.standing`: which
  archived runs stand for today's code; :mod:`.archive`: the committed copy of the runs;
* :mod:`.tables`, :mod:`.headline`, :mod:`.report`: the report; :mod:`.run`: making the
  runs; :mod:`.cli`: the commands.
"""
