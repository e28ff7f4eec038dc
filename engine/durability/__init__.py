"""Durability per year (`replab durability`): regenerative episodes sampled with importance sampling, each
replayed under every policy, turned into yearly figures with intervals.

- `episodes`: the failure model's episodes (pure numpy): sampling with balanced failure biasing in a defensive
  mixture with the model, the likelihood ratio, the sufficient statistics that re-weight an episode to other
  rates.
- `judge`: one episode → a short trace through the generator → every policy's verdict (the kernels).
- `estimate`: weighted verdicts → P(loss per year), nines, losses and unavailable minutes per year, intervals,
  effective sample size, bounds when nothing was lost, sensitivity.
- `run`: rounds of episodes in-process, their allocation to strata and mixture shares, sensitivity.
- `job`: the Spark job (mapInArrow over episode batches) and its outputs.
"""
