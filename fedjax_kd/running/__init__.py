"""What a run is made of, above the algorithms: building an experiment (data, models, the
federation, the algorithm) and planning its device memory, its checkpoints and work
directory files, the results it writes, and its processes (compilation cache, multi-host
start-up, the watchdog of lost processes). ``fedjax_kd.runner`` runs them."""
