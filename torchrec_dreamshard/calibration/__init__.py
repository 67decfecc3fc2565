"""Few-shot calibration on the user's own hardware and tables (:func:`calibrate`), and the
verification's public names (:mod:`torchrec_dreamshard.verification`)."""

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
from torchrec_dreamshard.verification.verification import VerifyOptions, verify, verify_candidates
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
