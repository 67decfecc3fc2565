"""What a placement costs, predicted, one concept per module:

* :mod:`~torchrec_dreamshard.cost.physics`: the physical quantities of a table's kernel;
* :mod:`~torchrec_dreamshard.cost.cost_net`: the cost network ``CostNet``;
* :mod:`~torchrec_dreamshard.cost.fitting`: cost samples from measurements, fitting, metrics;
* :mod:`~torchrec_dreamshard.cost.comm_topology`: collectives priced on the hosts' topology;
* :mod:`~torchrec_dreamshard.cost.sharding`: the costs of a table under each sharding type;
* :mod:`~torchrec_dreamshard.cost.plans`: the costs of a whole plan of sharding options.

Built on :mod:`torchrec_dreamshard.data` and on the fitted models of
:mod:`torchrec_dreamshard.measure`; the policy, calibration and the planner build on it.
"""
