"""The harness the benchmark scripts (and the tests of what they measure) share, over the
package; the package never imports it. The scripts run from a checkout
(``python benchmarks/NAME.py``, which puts ``benchmarks/`` on the path) and import it as
``harness``; pytest puts ``benchmarks/`` on the path too (``pythonpath`` in
``pyproject.toml``). One responsibility per module:

* :mod:`harness.task_draws`: the held-out tasks the benchmarks plan (every family's test
  draws, the pool's test split);
* :mod:`harness.plan_measuring`: plans measured on real kernels, every task's distinct
  plans in interleaved rounds, resumably;
* :mod:`harness.method_roster`: the generalisation benchmark's methods, calibrated ones
  included, and how each plans a task;
* :mod:`harness.default_planning`: a task's whole tables planned by
  ``DreamShardPlanner`` as the benchmarks measure it (the default method, the plan
  budgets);
* :mod:`harness.family_statistics`: ratios to the best heuristic, geometric means per
  family, the cost network's rank agreement;
* :mod:`harness.family_report`: the generalisation benchmark's Markdown;
* :mod:`harness.results_files`: where results go (``benchmarks/results/``), the machine
  they were taken on, and the raw files a resumable run reads back;
* :mod:`harness.busy_core`: another process spinning on one core while a benchmark runs;
* :mod:`harness.measured_search`: the headroom reference, a local search on real
  measurements;
* :mod:`harness.golden_plans`: recorded plans compared up to a relabelling of identical
  devices;
* :mod:`harness.step_families`: the step-time families the end-to-end step timer
  (:mod:`torchrec_dreamshard.evaluation.dmp_step`) runs;
* :mod:`harness.dlrm_jobs`: TorchRec's own ``DLRM`` over tables of one dim and its
  Poisson batches (the memory benchmark's model and the tests' ``torchrun`` job's).
"""
