"""Verification: candidate plans measured on real kernels in interleaved rounds, and the one
kept (:func:`~.verification.verify`), run after TorchRec's loop by
:mod:`torchrec_dreamshard.planner.steps.verify_step`."""
