"""The ranks the package measures and plans on, and how they talk.

* :mod:`~.spawn`: process groups of ranks spawned on this machine, a launcher-free
  environment for them, and the rule of never spawning inside a distributed job;
* :mod:`~.interpreters`: ranks started as fresh interpreters (``python -m``), waited for
  within a deadline, every rank ended where one fails;
* :mod:`~.job_group`: the distributed job's own process group while it plans: rank 0
  drives group tasks, the other ranks serve them, and what they broadcast;
* :mod:`~.torch_compat`: torch's own private names the thread groups need (the loopback
  gloo group, the flat collectives), in one place and checked at import.
"""
