"""The machine profile: what the planner measures (or loads) of the machine before
TorchRec's loop and freezes for it (:class:`~.machine_profile.MachineProfile`, stamped by
:class:`~.stamp.MachineStamp`), built within a :class:`~.budget.Budget` by
:func:`~.build.build_profile`.
"""
