"""Plans judged against each other: every placer by name (:mod:`.placers`) and the DMP
step timer (:mod:`.dmp_step`, its model :mod:`.step_model`, its intervals
:mod:`.step_stats`). Only the command line imports it."""
