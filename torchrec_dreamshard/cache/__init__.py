"""Where the package keeps what it measured once, and what the cache directory holds.

* :mod:`~.location`: the cache directory (:func:`~.location.cache_root`), and the block
  that moves it (:func:`~.location.using_cache_dir`);
* :mod:`~.machine_cache`: per-machine cache files, each keyed by what changes the
  measurement it holds, read or measured and written;
* :mod:`~.reference_time`: the reference kernel's time, measured once per machine;
* :mod:`~.store_keys`: where the calibration store lives, and the job key of each kernel;
* :mod:`~.inventory`: what ``dreamshard cache`` lists and clears.

The other parts' own files (the collective models, the dense kernel's model, the sharding
path's model, a verification's rounds) are kept by the modules that fit them, through
:mod:`~.machine_cache`.
"""
