"""Verification: candidate plans measured on real kernels in interleaved rounds, and the one
kept (:func:`~.verification.verify`). The planner runs it after TorchRec's loop
(:mod:`torchrec_dreamshard.planner.steps.verify_step`), the second of its two measuring steps.

:mod:`.verification` (``verify``: the candidates, TorchRec's plan among them, measured in
rounds within a budget and a hard cap), :mod:`.verify_timing` (what it measures with,
guarded), :mod:`.noise` (when measurements are too noisy: spread between rounds, a
drifting reference kernel; calibration's drift check uses it too), :mod:`.plan_ranking`
(which measured plan is kept: never one that did not beat TorchRec's beyond noise),
:mod:`.verify_result` (what it measured, in words), :mod:`.verify_cache` (its rounds cached
per machine and plan set).
"""
