"""Device table-sets timed once per round and shared between the placements that hold them
(``measure_placement(..., shared=)``), so one round's figures stay comparable.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from torchrec_dreamshard.data.tables import TableSpec
from torchrec_dreamshard.data.tasks import Task, device_tables

TimeGroups = Callable[[list[list[TableSpec]]], np.ndarray]


def device_sets(task: Task, placement: Sequence[int]) -> list[frozenset[int]]:
    """The set of table indices on each device of ``placement`` that holds a table."""
    return [frozenset(idx) for idx in device_tables(task, placement) if idx]


def distinct_device_sets(task: Task, placements: Sequence[Sequence[int]]) -> int:
    """How many distinct non-empty device table-sets ``placements`` hold together."""
    return len({s for p in placements for s in device_sets(task, p)})


@dataclass
class DeviceSetTimes:
    """One round's timing of each device table-set, and how much was shared.

    Attributes:
        timed: device sets timed (over every round this object saw).
        devices: non-empty devices of the placements measured with it (as many timings
            as measuring each placement on its own would have taken).
    """

    timed: int = 0
    devices: int = 0
    _task: Task | None = field(default=None, repr=False)
    _times: dict[frozenset[int], np.ndarray] = field(default_factory=dict, repr=False)
    _reference: np.ndarray | None = field(default=None, repr=False)

    def new_round(self) -> None:
        """Forget the figures of the round that ended (the counts stay)."""
        self._times.clear()
        self._reference = None

    @property
    def shared(self) -> int:
        """Device timings taken from another placement's measurement in the same round."""
        return self.devices - self.timed

    def compute(
        self, task: Task, placement: Sequence[int], rounds: int, time_groups: TimeGroups
    ) -> np.ndarray:
        """``[rounds, D + 1, 2]`` round medians of ``(fwd_ms, bwd_ms)`` per device, the
        reference kernel's last; only sets not timed this round go to ``time_groups``.

        Raises:
            ValueError: another task than the one this object timed, or figures of
                another number of rounds.
        """
        self._check_task(task)
        self._check_held(rounds)
        indices = device_tables(task, placement)
        keys = [frozenset(idx) for idx in indices]
        todo = [d for d, k in enumerate(keys) if k and k not in self._times]
        self.devices += sum(1 for k in keys if k)
        if todo or self._reference is None:
            timed = np.asarray(time_groups([[task.tables[i] for i in indices[d]] for d in todo]))
            self._check_rounds(timed, rounds)
            for j, d in enumerate(todo):
                self._times[keys[d]] = timed[:, j]
            self._reference = timed[:, -1]
            self.timed += len(todo)
        out = np.zeros((rounds, len(keys) + 1, 2))
        for d, k in enumerate(keys):
            if k:
                out[:, d] = self._times[k]
        out[:, -1] = self._reference
        return out

    def _check_task(self, task: Task) -> None:
        if self._task is None:
            self._task = task
        elif task is not self._task and task != self._task:
            raise ValueError(
                "DeviceSetTimes shares the timings of one task's device sets: it was given "
                f"a task of {len(task.tables)} tables after one of {len(self._task.tables)}"
            )

    @staticmethod
    def _check_rounds(timed: np.ndarray, rounds: int) -> None:
        if timed.ndim != 3 or timed.shape[0] != rounds:
            raise ValueError(f"device-set timings of shape {timed.shape} for {rounds} rounds")

    def _check_held(self, rounds: int) -> None:
        held = self._reference
        if held is not None and held.shape[0] != rounds:
            raise ValueError(
                f"this round's device sets were timed in {held.shape[0]} rounds, not {rounds}"
            )
