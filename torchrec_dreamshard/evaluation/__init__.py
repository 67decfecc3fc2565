"""Plans judged against each other, as the ``dreamshard`` command and user code do it:

* :mod:`~torchrec_dreamshard.evaluation.placers`: every placer by name (random, the
  heuristics, TorchRec, DreamShard's modes, measured-greedy), planned alone or each in
  turn and timed (``dreamshard collect --placer``);
* the end-to-end step timer: :mod:`~torchrec_dreamshard.evaluation.dmp_step` (real
  ``DistributedModelParallel`` training steps of plans, in rounds),
  :mod:`~torchrec_dreamshard.evaluation.step_model` (the DLRM-like model it trains, which
  ``dreamshard demo`` and the tests plan too) and
  :mod:`~torchrec_dreamshard.evaluation.step_stats` (intervals and verdicts), behind
  ``dreamshard steptime`` and ``dreamshard demo``.

It sits above the planner: it plans with every part of the package and measures the
plans; only the command line imports it. The benchmarks' own harness (the task draws,
the method rosters, the results files) is not part of the package: it lives beside the
scripts, in ``benchmarks/harness/``.
"""
