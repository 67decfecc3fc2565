"""The machine profile: what the planner measures (or loads) of the machine before
TorchRec's loop and freezes for it, and the budget it is built within."""
