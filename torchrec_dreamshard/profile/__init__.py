"""The machine profile: the one step before TorchRec's loop that measures the machine.

What the planner knows of the machine it plans for, measured (or loaded) before
TorchRec's planning loop and frozen for it: the reference kernel's time, the collective and
dense-kernel fits, and the cost network calibrated on this machine's kernels
(:class:`~.machine_profile.MachineProfile`), each stamped with what it was measured on
(:class:`~.stamp.MachineStamp`). :func:`~.build.build_profile` measures one within a budget
(:class:`~.budget.Budget`); a profile is a plain file that one node measures and every job
on the same hardware plans from.
"""
