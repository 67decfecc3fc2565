"""Where the package keeps what it measured once: the cache directory (:mod:`~.location`),
per-machine cache files (:mod:`~.machine_cache`), the reference kernel's time
(:mod:`~.reference_time`), the calibration store's keys (:mod:`~.store_keys`) and what
``dreamshard cache`` lists and clears (:mod:`~.inventory`)."""
