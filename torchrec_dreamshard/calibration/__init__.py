"""Few-shot calibration on the user's own hardware and tables, and verification by
measuring the best candidate plans.

Calibration (:func:`calibrate`). Within a time budget, on the local device:

1. each of the task's tables is timed alone (one fused kernel per table, several tables'
   kernels and the reference kernel in interleaved rounds);
2. then fused groups chosen to be informative: the device table sets of the heuristic and
   policy plans, most uncertain first (the ensemble members' spread of the group's
   predicted ``log(fwd + bwd)``);
3. every kernel's figures are kept in a :class:`~torchrec_dreamshard.measure.CostStore`
   (default :func:`default_store_path`), one row per kernel under a job key made of the
   hardware fingerprint, the workload (batch, optimizer, precision, device) and the content
   signature of its tables (:func:`table_signature`: everything but the name), so a second
   calibration of the same tables on the same machine measures nothing;
4. the cost network's device heads (``c, W, U, u, V``: the physical and the fusion part)
   are fine-tuned on those kernels with the bundled weights as the prior:

       loss = sum_k sum_s w_ks huber(log pred_k(s) - log meas(s)) / sum w
              + prior * mean_p (theta_p - theta_p^0)^2

   each member ``k`` on its own Poisson(1) bootstrap weights ``w_ks`` (so the members'
   disagreement still says where the data is thin). The table encoder is frozen, so the
   policy network sees the same table encodings as before;
5. the all-to-all head is set from the machine's fitted all-to-all model (the one the
   local measurement backend charges) at the task's batch size (:func:`with_comm_model`):
   the head has no batch input, so the prior's all-to-all is right at one batch size only.

Verification (:func:`verify`): the ``k`` candidate plans the cost model rates best (the
safety net's report), every classic heuristic's plan and TorchRec's own plan are measured
on real kernels in interleaved rounds; the incumbent stands unless another plan measured
faster than it in every round, and no plan that did not beat TorchRec's beyond the noise
is kept (:func:`rank_measured`). Noisy measurements
(:mod:`torchrec_dreamshard.verification.noise`: repeats that disagree,
a reference kernel that drifts) are measured again or give way to the safer plan, and
calibration discards kernels measured while the reference drifted.

The package, one concept per module (the store's path and job keys are
:mod:`torchrec_dreamshard.cache.store_keys`'):
:mod:`.kernel_samples` (what to measure, measuring within the budget, loading samples),
:mod:`.fine_tuning` (:func:`calibrate`), :mod:`.head_fitting` (fine-tuning the heads,
accuracy), :mod:`.auto` (whether the
checkpoint prices this machine right), :mod:`.planning`
(:func:`plan_task`, :class:`PlanOutcome`), :mod:`.adaptation_report` (the margins and
lines of what adapting bought) and :mod:`.calibrating_agent` (:class:`CalibratingAgent`).
Verification's modules are :mod:`torchrec_dreamshard.verification`'s; this package
re-exports its public names.
"""

from torchrec_dreamshard.cache.store_keys import (
    JOB_ROOT,
    STORE_ENV,
    default_store_path,
    job_prefix,
    kernel_job,
    table_signature,
)
from torchrec_dreamshard.calibration.auto import VerificationSettings
from torchrec_dreamshard.calibration.calibrating_agent import CalibratingAgent
from torchrec_dreamshard.calibration.fine_tuning import (
    FIT_RESERVE_S,
    CalibrationConfig,
    CalibrationResult,
    calibrate,
)
from torchrec_dreamshard.calibration.head_fitting import (
    HEAD_PARAMETERS,
    fine_tune,
    kernel_accuracy,
    scale_comm,
    scale_compute,
    with_comm_model,
)
from torchrec_dreamshard.calibration.kernel_samples import (
    KERNELS_PER_CALL,
    informative_groups,
    load_kernel_samples,
    measure_kernels,
)
from torchrec_dreamshard.calibration.planning import PlanOutcome, plan_task
from torchrec_dreamshard.verification.noise import Noise, NoiseLimits
from torchrec_dreamshard.verification.plan_ranking import (
    beats_beyond_noise,
    measuring_priority,
    rank_measured,
)
from torchrec_dreamshard.verification.verification import (
    VerifyOptions,
    verify,
    verify_candidates,
)
from torchrec_dreamshard.verification.verify_result import VerifiedPlan, VerifyResult
from torchrec_dreamshard.verification.verify_timing import Timing

__all__ = [
    "FIT_RESERVE_S",
    "HEAD_PARAMETERS",
    "JOB_ROOT",
    "KERNELS_PER_CALL",
    "Noise",
    "NoiseLimits",
    "Timing",
    "VerifyOptions",
    "STORE_ENV",
    "CalibratingAgent",
    "CalibrationConfig",
    "CalibrationResult",
    "PlanOutcome",
    "VerificationSettings",
    "VerifiedPlan",
    "VerifyResult",
    "beats_beyond_noise",
    "calibrate",
    "default_store_path",
    "fine_tune",
    "informative_groups",
    "job_prefix",
    "kernel_accuracy",
    "kernel_job",
    "load_kernel_samples",
    "measure_kernels",
    "measuring_priority",
    "plan_task",
    "rank_measured",
    "scale_comm",
    "scale_compute",
    "table_signature",
    "verify",
    "verify_candidates",
    "with_comm_model",
]
