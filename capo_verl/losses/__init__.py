"""Policy-loss math of the paper's baselines, free of verl imports (verl glue: :mod:`capo_verl.compat`)."""
