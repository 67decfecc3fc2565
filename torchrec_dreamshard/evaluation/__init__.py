"""The evaluation harness the benchmarks (``benchmarks/``) and the ``dreamshard`` command
share, one responsibility per module:

* :mod:`~torchrec_dreamshard.evaluation.placers`: every placer by name (random, the
  heuristics, TorchRec, DreamShard's modes, measured-greedy), planned alone or each in
  turn and timed;
* :mod:`~torchrec_dreamshard.evaluation.measured_search`: the headroom reference, a local
  search on real measurements;
* :mod:`~torchrec_dreamshard.evaluation.task_draws`: the held-out tasks the benchmarks
  plan (every family's test draws, the pool's test split);
* :mod:`~torchrec_dreamshard.evaluation.plan_measuring`: plans measured on real kernels,
  every task's distinct plans in interleaved rounds, resumably;
* :mod:`~torchrec_dreamshard.evaluation.method_roster`: the generalisation benchmark's
  methods, calibrated ones included, and how each plans a task;
* :mod:`~torchrec_dreamshard.evaluation.default_planning`: a task's whole tables planned
  by ``DreamShardPlanner`` as the benchmarks measure it (the default method, the plan
  budgets);
* :mod:`~torchrec_dreamshard.evaluation.family_statistics`: ratios to the best heuristic,
  geometric means per family, the cost network's rank agreement;
* :mod:`~torchrec_dreamshard.evaluation.family_report`: the generalisation benchmark's
  Markdown;
* :mod:`~torchrec_dreamshard.evaluation.results_files`: where results go, the machine they
  were taken on, and the raw files a resumable run reads back;
* the end-to-end step timer: :mod:`~torchrec_dreamshard.evaluation.dmp_step` (real
  ``DistributedModelParallel`` training steps of plans, in rounds),
  :mod:`~torchrec_dreamshard.evaluation.step_model` (the DLRM-like model it trains, which
  the demo and the tests plan too), :mod:`~torchrec_dreamshard.evaluation.step_stats`
  (intervals and verdicts) and :mod:`~torchrec_dreamshard.evaluation.step_families` (the
  step-time families).

It sits above the planner: it plans with every part of the package and measures the
plans; nothing but the command line and the benchmarks imports it.
"""
