"""Sweeps (`replab sweep`, `replab recommend`): one policy space over many seeds of a scenario.

- `engine.sweep.job`: the ONE Spark job over the seeds (generate, gate and replay each seed in its task);
- `engine.sweep.run`: the request, the job, the output gate, the `sweeps`/`sweep_results` tables and MLflow;
- `engine.sweep.estimates`: the estimates per policy with their 95 % intervals.
"""
