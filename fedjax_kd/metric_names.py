"""Per-round metric columns that an algorithm writes and the summaries above it read.

A leaf module: the algorithms name a column here, and :mod:`fedjax_kd.running.results` and the sweep
tools read it, without either importing the other.
"""

# An integer naming the model a round's ``test_acc`` scored, for an algorithm that scores
# different models in different rounds (FedConcat: 0 for the cluster models' mean, 1 for the
# concatenated model). Accuracy summaries over rounds read only the rounds that scored the
# final round's model (:func:`fedjax_kd.running.results.final_model_rows`).
SCORED_MODEL = 'scored_model'
